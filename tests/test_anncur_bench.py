"""benchmarks/anncur.py: its metrics against hand-computed values, annCUR beating a blind retriever on an exactly
low-rank score matrix, the spectrum summary, and a smoke run of the whole script (two untrained cross-encoders,
[CLS] and [emb], on a tiny BEIR folder) that writes the JSON and both figures and reuses its cached scores."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import anncur_eval as ev


def test_candidates_recall_and_ndcg_by_hand():
    exact = np.array([0.1, 0.9, 0.5, 0.7, 0.3])  # exact order: 1, 3, 2, 4, 0
    assert ev.topk_recall(exact, np.array([3, 0]), 1) == 0.0
    assert ev.topk_recall(exact, np.array([3, 0, 1]), 2) == 1.0
    assert ev.topk_recall(exact, np.array([2, 4]), 2) == 0.0
    assert ev.be_candidates(np.array([5.0, 1, 4, 3, 2]), 2).tolist() == [0, 2]
    approx = np.array([0.0, 5.0, 4.0, 1.0, 3.0])
    assert ev.anncur_candidates(approx, np.array([1, 3]), 4).tolist() == [1, 3, 2, 4]  # anchors, then best others
    ids = ["a", "b", "c", "d", "e"]
    assert ev.reranked_ids(np.array([4, 2, 1]), exact, ids, depth=2) == ["b", "c"]
    got = ev.judge(exact, np.array([2, 4]), ids, {"b": 1, "c": 2})
    dcg = 2 / np.log2(2)  # c first (exact 0.5 > e 0.3), then e (not relevant)
    ideal = 2 / np.log2(2) + 1 / np.log2(3)
    assert got["ndcg@10"] == pytest.approx(dcg / ideal) and got["topk_recall@1"] == 0.0
    assert "topk_recall@10" not in got  # k larger than the corpus is left out


def test_anncur_finds_the_exact_top_of_a_low_rank_matrix_and_a_blind_retriever_does_not():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((30, 4)) @ rng.standard_normal((4, 300))  # rank 4
    r_anc, m_test = m[:20], m[20:]
    ids = [f"d{i}" for i in range(300)]
    qrels = [{ids[int(np.argmax(row))]: 1} for row in m_test]  # the exact best document is the relevant one
    rows = ev.anncur_rows(m_test, r_anc, [4, 8], [10, 20], [0, 1], ids, qrels)
    assert [(r["k_i"], r["ce_calls"], r["k_r"]) for r in rows] == [(4, 10, 6), (4, 20, 16), (8, 10, 2), (8, 20, 12)]
    assert all(r["topk_recall@1"] == 1.0 and r["ndcg@10"] == 1.0 and r["seeds"] == 2 for r in rows)
    assert all(r["topk_recall@10"] == 1.0 for r in rows if r["k_r"] >= 10)  # exact scores: the top 10 come first
    assert rows[2]["topk_recall@10"] < 1.0  # k_r = 2: only anchors that happen to be top-10 add to the two found
    blind = ev.be_rows(m_test, rng.standard_normal(m_test.shape), [10, 20], ids, qrels)
    assert all(r["method"] == "be+ce" and r["topk_recall@10"] < 0.3 for r in blind)
    top = ev.exhaustive_row(m_test, ids, qrels)
    assert top["ce_calls"] == 300 and top["topk_recall@100"] == 1.0 and top["ndcg@10"] == 1.0


def test_spectrum_of_a_rank_three_matrix():
    rng = np.random.default_rng(1)
    s = ev.spectrum(rng.standard_normal((40, 3)) @ rng.standard_normal((3, 50)))
    assert s["shape"] == [40, 50] and s["normalized"][0] == 1.0 and len(s["normalized"]) == 40
    assert s["rank_r_error"]["1"] > 0.1 and s["rank_r_error"]["4"] < 1e-10 and s["normalized"][3] < 1e-10
    offsets = rng.standard_normal((40, 1)) * 10 + rng.standard_normal((40, 3)) @ rng.standard_normal((3, 50))
    assert ev.spectrum(offsets)["normalized"][3] > 1e-3  # a per-query offset is a fourth component ...
    centred = ev.spectrum(offsets, center_rows=True)  # ... that row-centring removes (it orders no document)
    assert centred["rank_r_error"]["2"] > 1e-3 and centred["normalized"][3] < 1e-10
    zero = ev.spectrum(np.zeros((5, 7)))
    assert zero["normalized"] == [0.0] * 5 and set(zero["rank_r_error"].values()) == {0.0}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny forward passes on 2 shared cores: a second intra-op thread only adds synchronisation."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_beir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("anncur-beir")
    topics = ["volcano lava magma", "penguin ice colony", "violin bow orchestra", "bread yeast oven", "comet orbit sun",
              "glacier valley melt", "chess gambit pawn", "coffee roast espresso", "tennis racket serve", "bee hive honey",
              "submarine sonar hull", "tulip bulb garden"]
    docs = [{"_id": f"d{i}", "title": t.split()[0], "text": f"All about {t}."} for i, t in enumerate(topics)]
    docs += [{"_id": f"f{i}", "text": f"Notes on item {i} and more."} for i in range(12)]
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (root / "queries.jsonl").write_text("\n".join(json.dumps({"_id": f"q{i}", "text": f"what about {t}"})
                                                  for i, t in enumerate(topics)) + "\n")
    (root / "qrels").mkdir()
    for split, ids in (("train", range(8)), ("test", range(8, 12))):
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in ids))
    return root


def untrained_checkpoint(head: str, path: Path, perturb=None) -> Path:
    """The packaged MiniLM with a seeded fresh `head` (changed by `perturb(scorer)` if given), saved as the trainer
    saves it."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from sieve.models.ce_heads import new_head
    from sieve.models.cross_encoder import CrossEncoder
    from sieve.models.weights import default_model_path
    from sieve.training.ce_train import save_fp16

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    classifier = AutoModelForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=1)
    scorer = new_head(head, classifier, tokenizer)
    if perturb is not None:
        with torch.no_grad():
            perturb(scorer)
    save_fp16(CrossEncoder(scorer, tokenizer, name=head, weights_hash="unsaved"), path)
    return path


@pytest.fixture(scope="module")
def cls_checkpoint(tmp_path_factory) -> Path:
    return untrained_checkpoint("cls", tmp_path_factory.mktemp("cls-ce"))


@pytest.fixture(scope="module")
def emb_checkpoint(tmp_path_factory) -> Path:
    return untrained_checkpoint("emb", tmp_path_factory.mktemp("emb-ce"))


def open_gated(scorer) -> None:
    """Half-open gates and a live [CLS] logit: both parts of the gated head vary from document to document."""
    scorer.gates.fill_(0.5)
    scorer.classifier.classifier.weight.normal_(0, 0.1)


@pytest.fixture(scope="module")
def gated_checkpoint(tmp_path_factory) -> Path:
    return untrained_checkpoint("gated", tmp_path_factory.mktemp("gated-ce"), open_gated)


def test_script_writes_json_and_figures_and_reuses_its_scores(tiny_beir, cls_checkpoint, emb_checkpoint, cache_dir,
                                                              tmp_path, monkeypatch):
    from benchmarks import anncur

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    argv = ["--data", str(tiny_beir), "--ce", f"cls={cls_checkpoint}", "--ce", f"emb={emb_checkpoint}",
            "--test-queries", "3", "--random-docs", "9", "--anchor-queries", "6", "--k-i", "2,4,8",
            "--budgets", "4,8", "--seeds", "2", "--max-length", "32", "--work-dir", str(tmp_path / "work"),
            "--out-dir", str(tmp_path / "out")]
    doc = anncur.main(argv)
    saved = json.loads((tmp_path / "out" / f"anncur_{tiny_beir.name}.json").read_text())
    assert saved["rows"] == doc["rows"] and saved["scale"]["documents"] == 12  # 3 judged + 9 random
    assert (tmp_path / "out" / f"anncur_{tiny_beir.name}.png").stat().st_size > 10_000
    assert (tmp_path / "out" / f"anncur_{tiny_beir.name}_spectrum.png").stat().st_size > 10_000
    assert set(saved["cross_encoders"]) == {"cls", "emb"} and saved["cross_encoders"]["emb"]["head"] == "emb"
    exact = saved["cross_encoders"]["cls"]["exact_scores"]
    assert exact["test_pairs"] == 36 and exact["anchor_pairs"] == 72 and exact["pairs_scored"] == 108
    methods = {(r["cross_encoder"], r["method"], r["k_i"], r["ce_calls"]) for r in saved["rows"]}
    assert ("emb", "anncur", 4, 8) in methods and ("cls", "be+ce", None, 4) in methods
    assert ("cls", "anncur", 8, 4) not in methods  # a budget below k_i cannot be spent
    for r in saved["rows"]:
        assert 0.0 <= r["topk_recall@10"] <= 1.0 and 0.0 <= r["ndcg@10"] <= 1.0
        assert r["method"] != "anncur" or r["topk_recall@1"] >= 0.0
    again = anncur.main(argv[:4] + argv[6:])  # cls alone, every score from the cache: nothing is scored twice
    assert again["cross_encoders"]["cls"]["exact_scores"]["pairs_scored"] == 108
    assert again["rows"] == [r for r in doc["rows"] if r["cross_encoder"] == "cls"]


def test_parts_of_a_gated_cross_encoder_are_evaluated_from_one_scoring_pass(tiny_beir, gated_checkpoint, cache_dir,
                                                                           tmp_path, monkeypatch):
    from benchmarks import anncur

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    argv = ["--data", str(tiny_beir), "--ce", f"g={gated_checkpoint}", "--parts", "--test-queries", "3",
            "--random-docs", "9", "--anchor-queries", "6", "--k-i", "2,4", "--budgets", "4,8", "--seeds", "1",
            "--max-length", "32", "--work-dir", str(tmp_path / "work"), "--out-dir", str(tmp_path / "out")]
    doc = anncur.main(argv)
    ces = doc["cross_encoders"]
    assert list(ces) == ["g", "g:cls", "g:cos"] and ces["g:cos"]["head"] == "gated part cos"
    assert {c["exact_scores"]["pairs_scored"] for c in ces.values()} == {108}  # 36 test + 72 anchor pairs, once
    labels = {r["cross_encoder"] for r in doc["rows"] if r["method"] == "anncur" and r["k_i"] == 4}
    assert labels == {"g", "g:cls", "g:cos"}
    spectra = {label: c["spectrum_all"]["normalized"] for label, c in ces.items()}
    assert spectra["g:cls"] != spectra["g:cos"] != spectra["g"]
    plain = anncur.main([a for a in argv if a != "--parts"])  # the sum alone: a cache of its own, same scores
    assert list(plain["cross_encoders"]) == ["g"] and plain["cross_encoders"]["g"]["exact_scores"]["pairs_scored"] == 108
    g_rows = [r for r in doc["rows"] if r["cross_encoder"] == "g"]
    assert [r["method"] for r in plain["rows"]] == [r["method"] for r in g_rows]
    for a, b in zip(plain["rows"], g_rows):
        assert a["topk_recall@1"] == pytest.approx(b["topk_recall@1"]) and a["ndcg@10"] == pytest.approx(b["ndcg@10"])
