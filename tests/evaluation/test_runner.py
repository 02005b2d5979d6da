"""The runner's aggregation against numbers worked out by hand, over a fake searcher with fixed rankings.

The fake stands in at the model boundary only: it returns the same Outcome/Candidates/QueryState records the
real Searcher does, so the in-process backend, the runner and the summary are the real code.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sieve.evaluation.backends import InProcessBackend
from sieve.evaluation.dataset import EvalData, load_split
from sieve.evaluation.report import eval_document, render, write_json
from sieve.evaluation.runner import EvalConfig, parse_pipelines, run_pipelines
from sieve.evaluation.summary import latency_stats
from sieve.evaluation.table2 import run_table2
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.searcher import Outcome
from sieve.pipeline.state import QueryState

FILLER = [f"f{i}" for i in range(40)]
RANKINGS = {  # query text -> ranked doc ids
    "one": ["d1", "d2", "d3"],
    "two": ["d3", "d2", "d4", "d5"],
    "three": FILLER + ["d9"],  # the one relevant document at rank 41
}
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1, "d5": 2, "d3": 0}, "q3": {"d9": 1}}
TIMINGS = {"one": {"be_encode": 4.0, "mips": 1.0, "total": 10.0},
           "two": {"be_encode": 6.0, "mips": 1.0, "total": 20.0},
           "three": {"be_encode": 11.0, "mips": 4.0, "total": 60.0}}


class FakeIndex:
    def __init__(self):
        self.doc_ids = sorted({d for ranking in RANKINGS.values() for d in ranking})
        self.size, self.version, self.index_dir = len(self.doc_ids), 1, Path("fake-index")

    def ids(self, rows):
        return [self.doc_ids[r] for r in rows]


class FakeSearcher:
    """Fixed rankings and timings per query; records the SearchParams it was given."""

    def __init__(self, cross_encoder=None):
        self.index = FakeIndex()
        self.biencoder = self.cmc = type("Model", (), {"name": "fake"})()
        self.cross_encoder = cross_encoder
        self.models = {"cmc": self.cmc, **({"ce": cross_encoder} if cross_encoder is not None else {})}
        self.calls = []

    def search(self, params):
        self.calls.append(params)
        rows = [self.index.doc_ids.index(d) for d in RANKINGS[params.query][:params.top_k]]
        counts = {"ce": params.cmc_k} if params.cross_encoder else {}
        state = QueryState(params.query, timings_ms=dict(TIMINGS[params.query]), counts=counts)
        return Outcome(Candidates(rows=rows), "retrieve", state, 1)


def toy_data() -> EvalData:
    return EvalData("toy", "test", Path("."), {"q1": "one", "q2": "two", "q3": "three"}, QRELS)


def run_toy(names=("be",), cross_encoder=None, log=print):
    searcher = FakeSearcher(cross_encoder)
    return run_pipelines(InProcessBackend(searcher), toy_data(), list(names), EvalConfig(), log=log), searcher


def test_quality_metrics_match_hand_computed_values():
    be = run_toy()[0]["be"]
    # q2: gains 1 at rank 2 and 2 at rank 4 (d3 is judged 0); ideal order is grades 2, 1
    ndcg_q2 = (1 / math.log2(3) + 2 / math.log2(5)) / (2 + 1 / math.log2(3))
    assert be["ndcg@10"] == pytest.approx((1 + ndcg_q2 + 0) / 3)
    assert be["mrr@10"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert be["recall@1"] == pytest.approx(1 / 3)
    assert be["recall@4"] == be["recall@8"] == be["recall@32"] == pytest.approx(2 / 3)
    assert be["recall@64"] == be["recall@100"] == pytest.approx(1.0)
    assert be["queries"] == 3 and be["ce_pairs"] == 0
    assert be["depth"] == pytest.approx((3 + 4 + 41) / 3)


def test_latency_percentiles_over_known_timings():
    be = run_toy()[0]["be"]
    # totals 10, 20, 60: median 20; p95 interpolates 90% of the way from 20 to 60
    assert (be["latency_ms_mean"], be["latency_ms_p50"], be["latency_ms_p95"]) == pytest.approx((30, 20, 56))
    assert be["stage_latency_ms"]["be_encode"] == pytest.approx({"mean": 7, "p50": 6, "p95": 10.5})
    assert be["stage_latency_ms"]["mips"] == pytest.approx({"mean": 2, "p50": 1, "p95": 3.7})
    assert list(be["stage_latency_ms"]) == ["be_encode", "mips", "total"]
    assert latency_stats([5.0]) == {"mean": 5.0, "p50": 5.0, "p95": 5.0}


def test_each_pipeline_sends_its_own_search_params():
    results, searcher = run_toy(["be", "be+cmc", "be+ce", "be+cmc+ce"], cross_encoder=object())
    sent = {(p.rerank, p.cmc_k, p.cross_encoder) for p in searcher.calls}
    assert sent == {("none", 64, False), ("cmc", 64, False), ("none", 64, True), ("cmc", 16, True)}
    assert {(p.top_k, p.retrieve_k) for p in searcher.calls} == {(100, 512)}
    assert len(searcher.calls) == 4 * (3 + 1)  # every query once, plus one warm-up per pipeline
    assert results["be+ce"]["ce_pairs"] == 64 and results["be+cmc+ce"]["ce_pairs"] == 16


def test_pipelines_needing_an_unconfigured_cross_encoder_are_skipped_with_a_message():
    messages = []
    results, searcher = run_toy(["be", "be+ce", "be+cmc+ce"], cross_encoder=None, log=messages.append)
    assert list(results) == ["be"]
    skipped = [m for m in messages if m.startswith("skipping")]
    assert len(skipped) == 2 and all("SIEVE_CROSS_ENCODER_PATH" in m for m in skipped)
    assert not any(p.cross_encoder for p in searcher.calls)
    assert run_table2(searcher, toy_data(), log=messages.append) is None
    assert "skipping --table2" in messages[-1]


def test_bad_pipeline_names_and_configs_are_refused():
    assert parse_pipelines("be+cmc, be,be") == ["be+cmc", "be"]
    with pytest.raises(ValueError, match="'colbert' is not a retriever \\(be, bm25, hybrid"):
        parse_pipelines("be,colbert")
    with pytest.raises(ValueError, match="'bm25' is not a reranker or cross-encoder"):
        parse_pipelines("be+bm25")
    with pytest.raises(ValueError, match="no pipeline"):
        parse_pipelines(" , ")
    with pytest.raises(ValueError, match="retrieve_k 64 must be >= 100"):
        EvalConfig(retrieve_k=64)
    with pytest.raises(ValueError, match="cmc_k"):
        EvalConfig(retrieve_k=128, cmc_k=256)


def test_json_has_the_documented_keys(tmp_path):
    results = run_toy(["be", "be+ce"], cross_encoder=object())[0]
    doc = eval_document(toy_data(), results, {"eval": {}}, "sieve eval --data toy")
    path = write_json(doc, tmp_path)
    assert path.name == "eval_toy.json"
    saved = json.loads(path.read_text())
    assert set(saved) == {"dataset", "split", "queries", "pipelines", "settings", "machine", "command", "created"}
    assert (saved["dataset"], saved["split"], saved["queries"]) == ("toy", "test", 3)
    expected = {"ndcg@10", "mrr@10", "latency_ms_p50", "latency_ms_p95", "latency_ms_mean", "stage_latency_ms",
                "ce_pairs", "queries", *(f"recall@{k}" for k in (1, 4, 8, 16, 32, 64, 100))}
    for entry in saved["pipelines"].values():
        assert expected <= set(entry)
        assert all(set(stats) == {"mean", "p50", "p95"} for stats in entry["stage_latency_ms"].values())
    assert "| be+ce | " in render(saved)


def test_plots_are_written_as_png(tmp_path):
    from sieve.evaluation.plots import write_plots

    doc = eval_document(toy_data(), run_toy(["be", "be+cmc"])[0], {}, "sieve eval")
    paths = write_plots(doc, tmp_path)
    assert [p.name for p in paths] == ["eval_toy_recall.png", "eval_toy_quality_latency.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_max_queries_takes_a_seeded_sample(demo_beir):
    full = load_split(demo_beir, "test")
    sample = load_split(demo_beir, "test", max_queries=3, seed=1)
    assert len(full.queries) == 8 and len(sample.queries) == 3
    assert set(sample.queries) <= set(full.queries) and set(sample.qrels) == set(sample.queries)
    assert load_split(demo_beir, "test", max_queries=3, seed=1).queries == sample.queries
    with pytest.raises(FileNotFoundError, match="splits in .*: test"):
        load_split(demo_beir, "dev")
