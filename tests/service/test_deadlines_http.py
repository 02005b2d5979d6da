"""Deadlines: a stage that cannot finish in time is skipped and the previous stage's order is returned, marked
partial, instead of an error (/search and /rerank)."""
from __future__ import annotations

import json

import pytest

from tests.server import Server

TEXTS = ["The Roman legions built roads across the empire.", "A telescope collects light from distant galaxies.",
         "Knead the dough and let it rise before baking bread.", "Yeast ferments sugar in bread dough."]


@pytest.fixture(scope="module")
def budget_server(demo_index, ce_checkpoint, tmp_path_factory):
    """A cross-encoder that is given 1 ms: it can never finish, CMC always can."""
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_CROSS_ENCODER_PATH": str(ce_checkpoint),
                  "SIEVE_STAGE_BUDGETS_MS": json.dumps({"ce": 1}), "SIEVE_CACHE_ENABLED": "false"},
                 tmp_path_factory.mktemp("logs") / "budget-server.log")
    yield srv
    srv.stop()


def test_cross_encoder_out_of_time_returns_the_cmc_ranking(budget_server):
    with budget_server.client() as client:
        body = {"query": "telescopes and galaxies", "top_k": 8, "cmc_k": 8}
        full = client.post("/search", json={**body, "cross_encoder": True}).json()
        cmc_only = client.post("/search", json={**body, "cross_encoder": False}).json()
        assert full["partial"] and full["skipped"] == ["ce"] and full["stages"] == ["retrieve", "cmc"]
        assert [r["id"] for r in full["results"]] == [r["id"] for r in cmc_only["results"]]
        assert all(r["scores"].get("ce") is None for r in full["results"])
        assert not cmc_only["partial"] and cmc_only["skipped"] == []
        metrics = client.get("/metrics").text
        assert 'sieve_partial_responses_total{endpoint="/search",skipped="ce"} 1.0' in metrics


def test_rerank_with_the_cross_encoder_out_of_time_keeps_the_callers_order(budget_server):
    with budget_server.client() as client:
        out = client.post("/rerank", json={"query": "bread", "documents": TEXTS, "model": "ce"}).json()
        assert out["partial"] and out["skipped"] == ["ce"]
        assert [r["index"] for r in out["results"]] == [0, 1, 2, 3]
        assert all(r["relevance_score"] is None for r in out["results"])


def test_search_past_its_timeout_falls_back_to_the_biencoder_order(client):
    body = {"query": "jazz improvisation and swing", "top_k": 6}
    late = client.post("/search", json={**body, "timeout_ms": 1}).json()  # gone before CMC can start
    plain = client.post("/search", json={**body, "rerank": "none"}).json()
    assert late["partial"] and "cmc" in late["skipped"] and late["stages"] == ["retrieve"]
    assert [r["id"] for r in late["results"]] == [r["id"] for r in plain["results"]]
    assert all(r["scores"].get("cmc") is None for r in late["results"])
    assert not late["cached"] and not client.post("/search", json={**body, "timeout_ms": 1}).json()["cached"]


def test_rerank_cmc_past_its_timeout_falls_back_to_inner_product_order(client):
    out = client.post("/rerank", json={"query": "baking bread", "documents": TEXTS, "timeout_ms": 1}).json()
    assert out["partial"] and out["skipped"] == ["cmc"]
    scores = [r["relevance_score"] for r in out["results"]]
    assert scores == sorted(scores, reverse=True) and {r["index"] for r in out["results"][:2]} == {2, 3}


def test_rerank_deadline_covers_encoding_new_texts(client):
    """40 new texts (two encoding batches of 32): past the deadline after the first batch, the rest are not encoded;
    nothing has scored every text, so the answer keeps the caller's order, unscored, marked partial."""
    texts = [f"Field note {i}: " + "basalt columns cool slowly and crack into hexagons " * 6 for i in range(40)]
    out = client.post("/rerank", json={"query": "how basalt columns form", "documents": texts, "timeout_ms": 1})
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["partial"] and body["skipped"] == ["cmc"]
    assert [r["index"] for r in body["results"]] == list(range(40))
    assert all(r["relevance_score"] is None for r in body["results"]), "every text was encoded despite the deadline"


def test_rerank_work_past_the_token_cap_is_413(client):
    """The test server allows 12,000 tokens per /rerank; 50 new texts of 300 words are 50 x 256 tokens as the
    candidate tower reads them (cut at 256), 40 of them 10,240. The cap counts real tokens: 300 characters of one
    "word" are a handful of tokens, not 256 (issue 34)."""
    long = [f"{i} " + "bread " * 300 for i in range(50)]
    refused = client.post("/rerank", json={"query": "q", "documents": long})
    assert refused.status_code == 413, refused.text
    error = refused.json()["error"]
    assert error["code"] == "too_much_work" and error["field"] == "documents" and "SIEVE_RERANK_MAX_TOKENS" in error["allowed"]
    assert client.post("/rerank", json={"query": "q", "documents": long[:40]}).status_code == 200
    indexed = [{"id": "astro-1"}] * 1 + [{"id": f"missing-{i}", "text": "short"} for i in range(49)]
    assert client.post("/rerank", json={"query": "q", "documents": indexed}).status_code == 200  # stored vectors: free


def test_generous_timeout_changes_nothing(client):
    body = {"query": "protein folding", "top_k": 5, "rerank": "cmc"}
    relaxed = client.post("/search", json={**body, "timeout_ms": 120_000, "retrieve_k": 50, "cmc_k": 10}).json()
    assert not relaxed["partial"] and relaxed["stages"] == ["retrieve", "cmc"]
