"""Real components on the bundled demo corpus: `sieve eval` in-process, the cached eval index, and Table 2 with a
tiny deterministic cross-encoder (random weights in the real CrossEncoder runtime, fake only at the model)."""
from __future__ import annotations

import json
from contextlib import closing
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from sieve.evaluation.backends import HttpBackend, InProcessBackend
from sieve.evaluation.dataset import load_split
from sieve.evaluation.local import ensure_index
from sieve.evaluation.metrics import mean_metric, ndcg_at_k
from sieve.evaluation.runner import EvalConfig, pipeline, run_pipelines
from sieve.evaluation.table2 import run_table2
from sieve.index import SearchIndex
from sieve.models.cmc_checkpoint import untrained_cmc
from sieve.models.cross_encoder import CrossEncoder, PairScorer
from sieve.pipeline.searcher import Searcher, SearchParams
from sieve.cli import main
from tests.server import Server


def test_sieve_eval_in_process_writes_table_json_and_plots(demo_beir, demo_index, cache_dir, tmp_path, monkeypatch,
                                                            capsys):
    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("SIEVE_CMC_PATH", "untrained")  # the identity CMC: be+cmc must then equal be exactly
    monkeypatch.setenv("SIEVE_CROSS_ENCODER_ENABLED", "false")  # no CE: be+ce is skipped with a message
    out = tmp_path / "results"
    main(["eval", "--data", str(demo_beir), "--index", str(demo_index), "--pipelines", "be,be+cmc,be+ce",
          "--out-dir", str(out), "--name", "demo"])
    captured = capsys.readouterr()
    assert "skipping be+ce" in captured.err and "| be+cmc |" in captured.out
    doc = json.loads((out / "eval_demo.json").read_text())
    be, cmc = doc["pipelines"]["be"], doc["pipelines"]["be+cmc"]
    assert set(doc["pipelines"]) == {"be", "be+cmc"} and be["queries"] == 8
    assert be["ndcg@10"] >= 0.8  # the hand-written queries name their topic plainly
    assert all(cmc[key] == be[key] for key in be if key.startswith(("ndcg", "mrr", "recall")))
    assert "cmc" in cmc["stage_latency_ms"] and "cmc" not in be["stage_latency_ms"]
    assert doc["settings"]["eval"]["retrieve_k"] == 512 and doc["command"].startswith("sieve eval --data")
    precision = doc["settings"]["backend"]["precision"]  # what each stage ran in (the suite runs SIEVE_PRECISION=fp32)
    assert set(precision) == {"bi_encoder_query", "bi_encoder_documents", "cmc", "vector_search"}, precision
    assert precision["cmc"]["runtime"] == "torch" and precision["vector_search"]["dtype"] == "fp32", precision
    assert (out / "eval_demo_recall.png").stat().st_size > 0 and (out / "eval_demo_quality_latency.png").is_file()


@pytest.fixture(scope="module")
def demo_searcher(demo_index, biencoder):
    index = SearchIndex.load(demo_index)
    searcher = Searcher(biencoder, index, untrained_cmc(biencoder), TinyCrossEncoder.build(biencoder.tokenizer))
    yield searcher
    searcher.close()
    index.close()


def test_untrained_cmc_ranks_exactly_as_the_biencoder(demo_beir, demo_searcher):
    data = load_split(demo_beir, "test")
    backend, cfg = InProcessBackend(demo_searcher), EvalConfig()
    for text in data.queries.values():
        be = backend.search(pipeline("be").params(text, cfg))
        cmc = backend.search(pipeline("be+cmc").params(text, cfg))
        assert cmc.ids == be.ids and len(be.ids) == 60  # retrieve_k 512 is clamped to the 60 documents
        assert "cmc" in cmc.timings_ms and "cmc" not in be.timings_ms


def test_eval_index_is_built_once_and_rebuilt_when_the_corpus_changes(demo_beir, biencoder, cache_dir, tmp_path):
    index_dir = tmp_path / "eval-index"
    versions = []
    for corpus in (demo_beir / "corpus.jsonl", demo_beir / "corpus.jsonl", tmp_path / "smaller.jsonl"):
        if not corpus.exists():
            corpus.write_text("".join((demo_beir / "corpus.jsonl").read_text().splitlines(keepends=True)[:50]))
        ensure_index(corpus, biencoder, index_dir, cache_dir)
        with SearchIndex.load(index_dir) as live:
            versions.append((live.version, live.size))
    assert versions == [(1, 60), (1, 60), (2, 50)]


class TinyClassifier(nn.Module):
    """Mean of a seeded per-token embedding: deterministic, independent of batch padding, and fast."""

    def __init__(self, vocab_size: int):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(vocab_size, generator=generator), requires_grad=False)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        mask = attention_mask.float()  # (B, T)
        return SimpleNamespace(logits=((self.weight[input_ids] * mask).sum(1) / mask.sum(1))[:, None])  # (B, 1)


class TinyCrossEncoder(CrossEncoder):
    """Counts the pairs it scores, so the Table-2 cache can be held to scoring each pair once."""

    pairs_scored = 0

    @classmethod
    def build(cls, tokenizer) -> "TinyCrossEncoder":
        return cls(PairScorer(TinyClassifier(len(tokenizer))), tokenizer, name="tiny-ce", weights_hash="0")

    def score(self, query, documents):
        self.pairs_scored += len(documents)
        return super().score(query, documents)


def test_table2_scores_each_pair_once_and_agrees_with_the_search_pipeline(demo_beir, demo_searcher):
    data = load_split(demo_beir, "test")
    ce = demo_searcher.cross_encoder
    ce.pairs_scored = 0
    table = run_table2(demo_searcher, data, cmc_over=(16, 32, 60), k_primes=(4, 8, 16), log=lambda _: None)
    # an untrained CMC keeps the bi-encoder's order, so every list shares the BE top 16: 16 pairs per query
    assert ce.pairs_scored == 16 * len(data.queries) and table["queries"] == 8
    rows = {(r["source"], r["cmc_over"], r["k_prime"]): r for r in table["rows"]}
    assert len(rows) == 3 + 3 * 3 and rows[("be", None, 16)]["ce_time_vs_be64"] == 1.0
    for n in (16, 32, 60):
        for k in (4, 8, 16):
            assert rows[("cmc", n, k)]["ndcg@10"] == pytest.approx(rows[("be", None, k)]["ndcg@10"])
    assert rows[("be", None, 4)]["ce_time_vs_be64"] < rows[("be", None, 8)]["ce_time_vs_be64"] < 1.0
    # reference: the same configuration through Searcher.search's own CE stage
    rankings = {qid: demo_searcher.index.ids(demo_searcher.search(SearchParams(
        text, top_k=10, retrieve_k=60, rerank="none", cmc_k=8, cross_encoder=True, retriever="be")).candidates.rows)
        for qid, text in data.queries.items()}
    assert rows[("be", None, 8)]["ndcg@10"] == pytest.approx(mean_metric(ndcg_at_k, rankings, data.qrels, 10))
    assert np.isfinite([r["ce_ms_mean"] for r in table["rows"]]).all()


def test_http_backend_measures_the_served_path_with_the_same_rankings(demo_beir, demo_index, demo_searcher, tmp_path):
    data, cfg = load_split(demo_beir, "test", max_queries=4), EvalConfig()
    server = Server({"SIEVE_INDEX_DIR": str(demo_index)}, tmp_path / "server.log")
    try:
        with closing(HttpBackend(server.url)) as http:
            assert http.stages == {"cmc"}  # the server has no cross-encoder configured
            messages = []
            served = run_pipelines(http, data, ["be", "be+cmc", "be+ce"], cfg, log=messages.append)
            for text in data.queries.values():
                result = http.search(pipeline("be+cmc").params(text, cfg))
                assert result.ids == InProcessBackend(demo_searcher).search(pipeline("be+cmc").params(text, cfg)).ids
                # every stage timed (the client asks for no-cache); the untrained CMC shares the bi-encoder's
                # query encoding, so there is no cmc_encode
                assert {"be_encode", "mips", "cmc", "total"} == set(result.timings_ms)
    finally:
        server.stop()
    local = run_pipelines(InProcessBackend(demo_searcher), data, ["be"], cfg, log=lambda _: None)
    assert list(served) == ["be", "be+cmc"] and any("skipping be+ce" in m for m in messages)
    assert served["be"]["ndcg@10"] == pytest.approx(local["be"]["ndcg@10"])
    assert served["be"]["recall@4"] == pytest.approx(local["be"]["recall@4"])
