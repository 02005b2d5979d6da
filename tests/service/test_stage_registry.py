"""The stage registry's proof: a reranker defined in this file alone, registered, is served by /search, /rerank,
/readyz and /metrics and evaluated by `sieve eval`, with no other file edited."""
from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from sieve.cli import main
from sieve.pipeline import registry
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.registry import RERANKER, StageSpec
from sieve.service.app import create_app
from sieve.service.config import Settings
from tests.evaluation.conftest import write_beir


class Reverser:
    """The toy's 'model': what /readyz names and the cache fingerprint identifies."""

    name = "toy-reverser"
    weights_hash = "toy-1"


class Reverse:
    """Reverses the candidate list (scores 0, 1, 2, ... in list order): easy to tell from any other stage."""

    name = "toy"
    skippable = True

    def __call__(self, state):
        with state.timed("toy"):
            n = len(state.candidates)
            state.counts["toy"] = n
            state.candidates = state.candidates.rerank_head("toy", np.arange(n, dtype=np.float32))
        return state


def rerank_texts(ctx):
    ctx.state.candidates = Candidates(rows=np.full(len(ctx.texts), -1), texts=ctx.texts)
    return [Reverse()]


TOY = StageSpec(name="toy", role=RERANKER, summary="reverses the list (a test stage)", build=lambda ctx: [Reverse()],
                load=lambda ctx: Reverser(), rerank=rerank_texts, identity=lambda model: [model.weights_hash])


@pytest.fixture()
def toy_registered():
    with registry.registered(TOY):
        yield


def test_a_stage_defined_in_one_file_is_served_end_to_end(toy_registered, demo_index, cache_dir):
    settings = Settings(index_dir=demo_index, cache_dir=cache_dir, cross_encoder_enabled=False, cache_enabled=False)
    with TestClient(create_app(settings)) as client:
        ready = client.get("/readyz").json()
        assert "toy" in ready["stages"]["reranker"] and ready["models"]["toy"] == "toy-reverser"

        query = {"query": "volcanic eruptions", "retriever": "be", "top_k": 6, "retrieve_k": 6, "cmc_k": 4}
        plain = client.post("/search", json={**query, "rerank": "none"}).json()
        toy = client.post("/search", json={**query, "rerank": "toy"}).json()
        assert [h["id"] for h in toy["results"]] == [h["id"] for h in plain["results"]][::-1]
        assert toy["stages"] == ["retrieve", "toy"] and toy["timings_ms"]["toy"] >= 0
        assert [h["scores"]["toy"] for h in toy["results"]] == [5, 4, 3, 2, 1, 0]
        assert [h["score"] for h in toy["results"]] == [5, 4, 3, 2, 1, 0]  # the last stage that ran ranks

        reranked = client.post("/rerank", json={"query": "q", "documents": ["a", "b", "c"], "model": "toy"}).json()
        assert [r["index"] for r in reranked["results"]] == [2, 1, 0] and reranked["model"] == "toy"

        unknown = client.post("/search", json={**query, "rerank": "nope"})
        assert unknown.status_code == 422 and "toy" in unknown.json()["error"]["allowed"]

        metrics = client.get("/metrics").text
        assert 'sieve_stage_latency_seconds_count{stage="toy"} 2.0' in metrics  # the /search and the /rerank
        assert 'sieve_stage_candidates_count{stage="toy"} 2.0' in metrics


def test_sieve_eval_runs_a_pipeline_with_the_registered_stage(toy_registered, demo_index, cache_dir, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("SIEVE_CROSS_ENCODER_ENABLED", "false")
    data, out = write_beir(tmp_path / "beir"), tmp_path / "results"
    main(["eval", "--data", str(data), "--index", str(demo_index), "--pipelines", "be,be+toy", "--out-dir", str(out),
          "--name", "toy"])
    doc = json.loads((out / "eval_toy.json").read_text())
    be, toy = doc["pipelines"]["be"], doc["pipelines"]["be+toy"]
    assert "toy" in toy["stage_latency_ms"] and "toy" not in be["stage_latency_ms"]
    assert toy["ndcg@10"] < be["ndcg@10"]  # the reversed top 100 puts the relevant documents last


def test_without_registration_the_name_is_refused(demo_index, cache_dir):
    assert registry.get("toy") is None
    settings = Settings(index_dir=demo_index, cache_dir=cache_dir, cross_encoder_enabled=False, cache_enabled=False)
    with TestClient(create_app(settings)) as client:
        r = client.post("/search", json={"query": "q", "rerank": "toy"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "rerank"
        assert client.post("/rerank", json={"query": "q", "documents": ["a"], "model": "toy"}).status_code == 422
