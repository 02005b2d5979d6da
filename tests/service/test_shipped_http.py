"""A server started with no model settings serves the shipped trained defaults (checkpoints/)."""
from __future__ import annotations

import pytest

from sieve import checkpoints
from tests.server import Server


@pytest.fixture(scope="module")
def shipped_server(demo_index, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index)}, tmp_path_factory.mktemp("logs") / "shipped.log",
                 shipped_models=True)
    yield srv
    srv.stop()


def test_default_server_serves_hybrid_then_the_shipped_fusion_cmc(shipped_server):
    """No settings, no request flags: hybrid first stage -> fusion CMC; the cross-encoder is loaded but off."""
    with shipped_server.client() as client:
        models = client.get("/readyz").json()["models"]
        assert models["cmc"] == "cmc-fusion-mlp" and models["cross_encoder"] == "cross-encoder"
        hits = client.post("/search", json={"query": "how do volcanoes erupt", "top_k": 10})
    assert hits.status_code == 200, hits.text
    body = hits.json()
    assert body["stages"] == ["retrieve", "cmc"] and body["timings_ms"]["bm25"] > 0 and body["timings_ms"].get("ce") is None
    results = body["results"]
    assert results[0]["id"].startswith("volcano-")
    # trained fusion: CMC's scores are not the first stage's RRF scores, and rank by more than that order
    assert max(abs(r["scores"]["cmc"] - r["scores"]["retrieve"]) for r in results) > 0.1
    assert checkpoints.shipped(checkpoints.CMC)


def test_the_shipped_cross_encoder_runs_after_cmc_when_asked(shipped_server):
    with shipped_server.client() as client:
        assert client.get("/readyz").json()["models"]["cross_encoder"] == "cross-encoder"
        body = client.post("/search", json={"query": "how do volcanoes erupt", "top_k": 20,
                                            "cross_encoder": True}).json()
    assert body["stages"] == ["retrieve", "cmc", "ce"]
    scored = [r for r in body["results"] if r["scores"].get("ce") is not None]
    assert len(scored) == 16 and body["results"][:16] == scored  # default cmc_k: the CE's 16 lead the list
    assert [r["score"] for r in scored] == sorted((r["score"] for r in scored), reverse=True)
    assert scored[0]["id"].startswith("volcano-")
