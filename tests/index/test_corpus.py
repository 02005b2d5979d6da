from __future__ import annotations

import pytest

from sieve.index import Document, corpus_hash, read_beir_corpus, read_qrels, read_queries


def test_full_text_joins_title_and_text() -> None:
    assert Document("1", "Title", "Body").full_text == "Title Body"
    assert Document("1", "", "Body").full_text == "Body"
    assert Document("1", "Title", "").full_text == "Title"


def test_read_corpus_title_optional_and_numeric_ids(write_lines) -> None:
    path = write_lines("corpus.jsonl", [
        '{"_id": "a", "title": "T", "text": "x"}',
        "",
        '{"_id": 7, "text": "y", "metadata": {}}',
    ])
    assert read_beir_corpus(path) == [Document("a", "T", "x"), Document("7", "", "y")]


@pytest.mark.parametrize("line, fragment", [
    ('{"_id": "a", "text": ', "not valid JSON"),
    ('{"title": "no id", "text": "x"}', "missing or invalid '_id'"),
    ('["a", "b"]', "expected a JSON object"),
    ('{"_id": "a", "text": 5}', "'text' must be a string"),
])
def test_read_corpus_reports_line_number(write_lines, line: str, fragment: str) -> None:
    path = write_lines("corpus.jsonl", ['{"_id": "ok", "text": "fine"}', line])
    with pytest.raises(ValueError, match=fragment) as exc:
        read_beir_corpus(path)
    assert f"{path}:2:" in str(exc.value)


def test_read_queries(write_lines) -> None:
    path = write_lines("queries.jsonl", ['{"_id": "q1", "text": "what"}',
                                         '{"_id": "q2", "text": "why", "metadata": {}}'])
    assert read_queries(path) == {"q1": "what", "q2": "why"}


def test_read_qrels(write_lines) -> None:
    path = write_lines("test.tsv", ["query-id\tcorpus-id\tscore", "q1\td1\t1",
                                    "q1\td2\t2", "q2\td1\t0"])
    assert read_qrels(path) == {"q1": {"d1": 1, "d2": 2}, "q2": {"d1": 0}}


@pytest.mark.parametrize("line, fragment", [("q1\td1", "expected 3"), ("q1\td1\thigh", "not an integer")])
def test_read_qrels_malformed(write_lines, line: str, fragment: str) -> None:
    path = write_lines("bad.tsv", ["query-id\tcorpus-id\tscore", line])
    with pytest.raises(ValueError, match=fragment) as exc:
        read_qrels(path)
    assert f"{path}:2:" in str(exc.value)


def test_corpus_hash_depends_on_ids_texts_and_order() -> None:
    a, b = Document("1", "t", "x"), Document("2", "", "y")
    h = corpus_hash([a, b])
    assert len(h) == 64 and h == corpus_hash([Document("1", "t", "x"), b])
    assert h != corpus_hash([b, a])
    assert h != corpus_hash([Document("9", "t", "x"), b])
    assert h != corpus_hash([Document("1", "t", "x!"), b])


def test_real_scifact_files(scifact_dir) -> None:
    docs = read_beir_corpus(scifact_dir / "corpus.jsonl")
    assert len(docs) == 5183 and len({d.id for d in docs}) == 5183
    qrels = read_qrels(scifact_dir / "qrels" / "test.tsv")
    queries = read_queries(scifact_dir / "queries.jsonl")
    assert len(qrels) == 300
    assert set(qrels) <= set(queries)
    assert all(d in {x.id for x in docs} for judged in qrels.values() for d in judged)
