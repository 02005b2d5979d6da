"""benchmarks/feedback_learn_time.py: the click logs it times the learner on (no learner run here)."""
from __future__ import annotations

import json

from benchmarks.feedback_learn_time import click_log
from sieve.index import SearchIndex, build_index
from tests.index.conftest import FakeEncoder, make_docs


def beir_folder(tmp_path, docs):
    data = tmp_path / "data"
    (data / "qrels").mkdir(parents=True)
    queries = {f"q{i}": docs[i].text.split()[0] + " " + docs[i].text.split()[1] for i in range(6)}
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n"
                                               for d in docs))
    rows = [f"q{i}\t{docs[i].id}\t1" for i in range(6)] + [f"q{i}\t{docs[i + 10].id}\t1" for i in range(6)]
    (data / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return data, queries


def test_a_ranked_log_shows_the_index_bm25_top_10_and_a_random_one_the_relevant_among_others(tmp_path):
    docs = make_docs(60)
    index = tmp_path / "idx"
    build_index(docs, FakeEncoder(), index, progress=False)
    data, queries = beir_folder(tmp_path, docs)
    clicks = click_log(data, 200, tmp_path / "ranked.jsonl", index=index)
    answers = [json.loads(line) for line in (tmp_path / "ranked.jsonl").read_text().splitlines()]
    assert len(answers) == 200 and clicks == sum(len(a["clicked"]) for a in answers)
    with SearchIndex.load(index) as loaded:
        for text in {a["query"] for a in answers}:
            want = [d.id for d in loaded.documents([int(r) for r in loaded.search_lexical(text, 10)[1]])]
            assert all(a["shown"] == want for a in answers if a["query"] == text)
    assert all(set(a["clicked"]) <= set(a["shown"]) for a in answers)
    click_log(data, 200, tmp_path / "random.jsonl")
    shuffled = [json.loads(line) for line in (tmp_path / "random.jsonl").read_text().splitlines()]
    relevant = {q: {docs[i].id, docs[i + 10].id} for i, q in enumerate(queries)}
    by_text = {t: q for q, t in queries.items()}
    assert all(len(a["shown"]) == 10 and relevant[by_text[a["query"]]] <= set(a["shown"]) for a in shuffled)
