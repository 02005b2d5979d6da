"""The remote cross-encoder stage through real HTTP: a front Sieve (SIEVE_CE_URL) calling a second Sieve process
that serves its cross-encoder (the `sieve` /rerank and the `cohere` /v2/rerank shapes), that second Sieve stopped
with SIGSTOP, and a stub TEI server (tests/stub_reranker.py) that is absent, comes back, and stalls."""
from __future__ import annotations

import math
import os
import re
import signal
import time

import cohere
import httpx
import pytest

from tests.server import Server, free_port
from tests.stub_reranker import StubReranker

QUERY = {"query": "how do telescopes see distant galaxies", "top_k": 4, "retrieve_k": 20, "cmc_k": 4}
FRESH = {"Cache-Control": "no-cache"}
TEXTS = ["The Roman legions built roads across the empire.", "A telescope collects light from distant galaxies.",
         "Knead the dough and let it rise before baking bread.", "Bread ovens in Rome baked loaves for the legions."]


def front(demo_index, tmp_path_factory, name: str, env: dict) -> Server:
    return Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_CACHE_ENABLED": "false", **env},
                  tmp_path_factory.mktemp("logs") / f"{name}.log")


@pytest.fixture(scope="module")
def front_sieve(demo_index, ce_server, tmp_path_factory):
    srv = front(demo_index, tmp_path_factory, "front-sieve", {"SIEVE_CE_URL": ce_server.url, "SIEVE_CE_SHAPE": "sieve"})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def front_cohere(demo_index, ce_server, tmp_path_factory):
    srv = front(demo_index, tmp_path_factory, "front-cohere",
                {"SIEVE_CE_URL": ce_server.url, "SIEVE_CE_SHAPE": "cohere", "SIEVE_CE_MODEL_NAME": "ce"})
    yield srv
    srv.stop()


def search(server: Server, **extra) -> tuple[dict, float]:
    with server.client() as client:
        started = time.monotonic()
        reply = client.post("/search", json={**QUERY, "cross_encoder": True, **extra}, headers=FRESH)
        elapsed = time.monotonic() - started
    assert reply.status_code == 200, reply.text
    return reply.json(), elapsed


def metric(server: Server, name: str, **labels) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}{re.escape('{' + selector + '}') if labels else ''} (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def ready(server: Server) -> dict:
    reply = httpx.get(f"{server.url}/readyz", timeout=30)
    assert reply.status_code == 200, "a down remote cross-encoder never makes the front unready"
    return reply.json()


@pytest.mark.parametrize("front_name", ["front_sieve", "front_cohere"])
def test_remote_cross_encoder_ranks_as_the_ce_server_does_itself(front_name, ce_server, request):
    remote, _ = search(request.getfixturevalue(front_name))
    local, _ = search(ce_server)
    assert remote["stages"] == local["stages"] == ["retrieve", "cmc", "ce"]
    assert not remote["partial"] and remote["skipped"] == []
    assert [h["id"] for h in remote["results"]] == [h["id"] for h in local["results"]]
    for got, want in zip(remote["results"], local["results"]):
        assert math.isclose(got["scores"]["ce"], want["scores"]["ce"], rel_tol=1e-4, abs_tol=1e-4)
    assert remote["timings_ms"]["ce"] > 0


def test_rerank_and_cohere_v2_on_the_front_go_to_the_remote(front_sieve, front_cohere, ce_server):
    body = {"query": "how is bread baked", "documents": TEXTS, "model": "ce"}
    with front_cohere.client() as client:
        remote = client.post("/rerank", json=body).json()
    with ce_server.client() as client:
        local = client.post("/rerank", json=body).json()
    assert [r["index"] for r in remote["results"]] == [r["index"] for r in local["results"]]
    assert not remote["partial"]
    sdk = cohere.ClientV2(base_url=front_sieve.url, api_key="unused", timeout=120)
    reply = sdk.rerank(model="rerank-v3.5", query="how is bread baked", documents=TEXTS)  # = the (remote) CE
    assert [r.index for r in reply.results] == [r["index"] for r in local["results"]]
    for got, want in zip(reply.results, local["results"]):
        assert math.isclose(got.relevance_score, want["relevance_score"], rel_tol=1e-4, abs_tol=1e-4)


def test_readyz_and_metrics_show_the_remote_stage(front_sieve):
    search(front_sieve)
    status = ready(front_sieve)
    assert status["models"]["cross_encoder"] == "remote:sieve"
    remote = status["remote_cross_encoder"]
    assert remote["state"] == "closed" and remote["shape"] == "sieve" and remote["url"].endswith("/rerank")
    assert metric(front_sieve, "sieve_remote_ce_calls_total", outcome="ok") >= 1
    assert metric(front_sieve, "sieve_remote_ce_breaker_open") == 0
    assert metric(front_sieve, "sieve_stage_latency_seconds_count", stage="ce") >= 1


def test_a_stopped_ce_server_gives_partial_answers_within_the_deadline(front_sieve, ce_server):
    cmc_only, _ = search(front_sieve, cross_encoder=False)
    os.kill(ce_server.proc.pid, signal.SIGSTOP)
    try:
        for _ in range(2):
            answer, elapsed = search(front_sieve, timeout_ms=3000)
            assert answer["partial"] and answer["skipped"] == ["ce"] and answer["stages"] == ["retrieve", "cmc"]
            assert [h["id"] for h in answer["results"]] == [h["id"] for h in cmc_only["results"]]
            assert any("did not answer in time" in w for w in answer["warnings"])
            assert elapsed < 3 + 5, f"{elapsed:.1f} s for a 3 s deadline"
        assert metric(front_sieve, "sieve_remote_ce_calls_total", outcome="timeout") >= 2
    finally:
        os.kill(ce_server.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 120
    while True:  # the woken server first works off what queued up while it was stopped
        answer, _ = search(front_sieve, timeout_ms=30_000)
        if not answer["partial"] or time.monotonic() > deadline:
            break
    assert not answer["partial"] and answer["stages"] == ["retrieve", "cmc", "ce"]


# -- a TEI-shaped stub: absent, back, stalled --------------------------------------------------------------------
STUB_PORT = free_port()


@pytest.fixture(scope="module")
def front_tei(demo_index, tmp_path_factory):
    srv = front(demo_index, tmp_path_factory, "front-tei",
                {"SIEVE_CE_URL": f"http://127.0.0.1:{STUB_PORT}", "SIEVE_CE_SHAPE": "tei", "SIEVE_CE_RETRIES": "1",
                 "SIEVE_CE_RETRY_BACKOFF_MS": "20", "SIEVE_CE_BREAKER_FAILURES": "2", "SIEVE_CE_BREAKER_OPEN_S": "2"})
    yield srv
    srv.stop()


def test_tei_server_absent_then_back_then_stalled(front_tei, tmp_path):
    cmc_ids = [h["id"] for h in search(front_tei, cross_encoder=False)[0]["results"]]
    for _ in range(2):  # nothing listens: connection refused, one retry, then the CMC order
        answer, _ = search(front_tei, timeout_ms=10_000)
        assert answer["partial"] and answer["skipped"] == ["ce"] and [h["id"] for h in answer["results"]] == cmc_ids
    status = ready(front_tei)["remote_cross_encoder"]
    assert status["state"] == "open" and status["consecutive_failures"] == 2
    assert metric(front_tei, "sieve_remote_ce_breaker_open") == 1
    answer, _ = search(front_tei, timeout_ms=10_000)
    assert answer["partial"] and any("circuit breaker open" in w for w in answer["warnings"])
    assert metric(front_tei, "sieve_remote_ce_calls_total", outcome="short_circuited") >= 1

    stub = StubReranker(STUB_PORT, "tei", tmp_path / "tei.log")
    try:
        time.sleep(2.2)  # the breaker's open time: the next call is the probe
        answer, _ = search(front_tei, timeout_ms=30_000, return_documents=True)
        assert not answer["partial"] and answer["stages"] == ["retrieve", "cmc", "ce"]
        lengths = [float(len(f"{h['document']['title']} {h['document']['text']}".strip())) for h in answer["results"]]
        assert [h["scores"]["ce"] for h in answer["results"]] == lengths == sorted(lengths, reverse=True)
        assert ready(front_tei)["remote_cross_encoder"]["state"] == "closed" and stub.requests() == 1
    finally:
        stub.stop()

    stalled = StubReranker(STUB_PORT, "stall", tmp_path / "stall.log")
    try:
        answer, elapsed = search(front_tei, timeout_ms=2000)
        assert answer["partial"] and answer["skipped"] == ["ce"] and [h["id"] for h in answer["results"]] == cmc_ids
        assert elapsed < 2 + 5, f"{elapsed:.1f} s for a 2 s deadline"
        assert stalled.requests() == 1
    finally:
        stalled.stop()
