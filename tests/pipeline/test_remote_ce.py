"""The remote cross-encoder client and stage (pipeline/remote_ce.py) against real stub rerank servers
(tests/stub_reranker.py, each its own process): shapes, retries, deadlines, the circuit breaker, and the stage's
skip contract with the runner."""
from __future__ import annotations

import time

import numpy as np
import pytest
from pydantic import ValidationError

from sieve.pipeline.batching import BatchConfig, Runners
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.circuit_breaker import CircuitBreaker
from sieve.pipeline.remote_ce import (RemoteConfig, RemoteCrossEncoder, RemoteCrossEncoderRerank, RemoteFailed,
                                      endpoint_url, public_url, read_scores)
from sieve.pipeline.runner import run_stage
from sieve.pipeline.state import QueryState
from sieve.service.config import Settings
from tests.server import free_port
from tests.stub_reranker import StubReranker

TEXTS = ["short", "a much longer text than the others", "medium text"]
BY_LENGTH = [1, 2, 0]  # the stub scores a text by its length


# -- circuit breaker -----------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_then_lets_one_probe_through():
    clock = Clock()
    breaker = CircuitBreaker(failures_to_open=3, open_s=5, clock=clock)
    breaker.failure(), breaker.failure(), breaker.success(), breaker.failure(), breaker.failure()
    assert breaker.state == "closed", "a success in between resets the count"
    breaker.failure()
    assert breaker.state == "open" and not breaker.allow()
    assert breaker.status()["retry_in_s"] == pytest.approx(5)
    clock.now += 5
    assert breaker.state == "half_open"
    assert breaker.allow() and not breaker.allow(), "only one probe while half-open"
    breaker.failure()  # the probe failed: open again for another open_s
    assert breaker.state == "open" and breaker.status()["opened_total"] == 2
    clock.now += 5
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.allow() and breaker.allow()
    assert breaker.status()["consecutive_failures"] == 0


# -- shapes and settings ---------------------------------------------------------------------------------------
def test_each_shape_reads_scores_back_in_the_order_the_texts_were_sent():
    tei = [{"index": 2, "score": 0.5}, {"index": 0, "score": 0.25}, {"index": 1, "score": -1.0}]
    cohere = {"results": [{"index": i["index"], "relevance_score": i["score"]} for i in tei]}
    for shape, body in (("tei", tei), ("cohere", cohere), ("sieve", {**cohere, "partial": False})):
        assert read_scores(shape, body, 3).tolist() == [0.25, -1.0, 0.5]


@pytest.mark.parametrize("body", [
    {"results": [{"index": 0, "relevance_score": 1.0}]},  # top_n ignored: texts without a score
    {"results": [{"index": 3, "relevance_score": 1.0}, {"index": 0, "relevance_score": 1.0},
                 {"index": 1, "relevance_score": 1.0}]},  # index out of range
    {"results": [{"index": i, "relevance_score": None} for i in range(3)]},
    {"results": [{"index": i, "relevance_score": float("nan")} for i in range(3)]},
    {"detail": "not a rerank answer"},
])
def test_an_answer_that_does_not_score_every_text_is_refused(body):
    with pytest.raises((ValueError, KeyError)):
        read_scores("cohere", body, 3)


def test_a_partial_remote_sieve_answer_counts_as_late():
    body = {"results": [{"index": i, "relevance_score": None} for i in range(3)], "partial": True}
    with pytest.raises(RemoteFailed) as raised:
        read_scores("sieve", body, 3)
    assert raised.value.outcome == "late" and raised.value.breaker


def test_urls_get_the_shapes_usual_path_and_lose_their_credentials():
    assert endpoint_url("http://tei:8080", "tei") == "http://tei:8080/rerank"
    assert endpoint_url("http://ce:8000/", "cohere") == "http://ce:8000/v2/rerank"
    assert endpoint_url("http://infinity:7997/v1/rerank", "cohere") == "http://infinity:7997/v1/rerank"
    assert public_url("https://user:secret@api.example.com/v2/rerank") == "https://api.example.com/v2/rerank"


@pytest.mark.parametrize("env", [{"ce_url": "tei:8080"}, {"ce_url": "ftp://host/rerank"},
                                 {"ce_url": "http://ce:8000", "ce_shape": "jina"}])
def test_settings_refuse_a_url_or_shape_the_client_cannot_use(env):
    with pytest.raises(ValidationError):
        Settings(**env)


# -- against real stub servers -----------------------------------------------------------------------------------
def remote(port: int, shape: str = "tei", **config) -> RemoteCrossEncoder:
    return RemoteCrossEncoder(RemoteConfig(url=f"http://127.0.0.1:{port}", shape=shape, **config))


@pytest.fixture()
def stub(tmp_path):
    started = []

    def start(mode: str, fail_first: int = 0, port: int | None = None) -> StubReranker:
        started.append(StubReranker(port or free_port(), mode, tmp_path / f"stub-{len(started)}.log", fail_first))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.mark.parametrize("shape", ["tei", "cohere"])
def test_scores_come_back_from_a_real_server_in_either_shape(stub, shape):
    server = stub(shape)
    client = remote(server.port, shape)
    outcomes = []
    client.on_outcome = outcomes.append
    scores = client.score("q", TEXTS, time.monotonic() + 30)
    assert scores.tolist() == [float(len(t)) for t in TEXTS]
    assert outcomes == ["ok"] and client.breaker.state == "closed"
    client.close()


def test_a_flaky_server_is_retried_with_backoff_while_time_remains(stub):
    server = stub("tei", fail_first=2)
    client = remote(server.port, retries=2, backoff_s=0.05)
    retries = []
    client.on_retry = lambda: retries.append(1)
    assert client.score("q", TEXTS, time.monotonic() + 30).tolist() == [float(len(t)) for t in TEXTS]
    assert len(retries) == 2 and server.requests() == 3


def test_an_unreadable_answer_is_not_retried_and_counts_against_the_remote(stub):
    server = stub("garbage")
    client = remote(server.port, retries=3, failures_to_open=1)
    with pytest.raises(RemoteFailed) as raised:
        client.score("q", TEXTS, time.monotonic() + 30)
    assert raised.value.outcome == "malformed" and server.requests() == 1 and client.breaker.state == "open"


def test_no_retry_when_its_backoff_would_pass_the_deadline(stub):
    server = stub("tei", fail_first=5)
    client = remote(server.port, retries=5, backoff_s=2.0)
    with pytest.raises(RemoteFailed) as raised:
        client.score("q", TEXTS, time.monotonic() + 1.0)
    assert raised.value.outcome == "error" and server.requests() == 1


def test_a_stalled_server_costs_the_remaining_deadline_not_more(stub):
    server = stub("stall")
    client = remote(server.port)
    started = time.monotonic()
    with pytest.raises(RemoteFailed) as raised:
        client.score("q", TEXTS, started + 0.8)
    elapsed = time.monotonic() - started
    assert raised.value.outcome == "timeout"
    assert 0.7 <= elapsed < 5, f"{elapsed:.2f} s for a 0.8 s deadline"
    assert server.requests() == 1, "a timeout is not retried: no time is left for it"


def test_breaker_opens_on_a_dead_port_and_closes_when_a_server_comes_back(stub):
    port = free_port()  # nothing listens there
    client = remote(port, retries=1, backoff_s=0.01, failures_to_open=2, open_s=1.0)
    outcomes = []
    client.on_outcome = outcomes.append
    for _ in range(2):
        with pytest.raises(RemoteFailed):
            client.score("q", TEXTS, time.monotonic() + 10)
    assert client.breaker.state == "open"
    started = time.monotonic()
    with pytest.raises(RemoteFailed) as raised:
        client.score("q", TEXTS, time.monotonic() + 10)
    assert raised.value.outcome == "short_circuited" and time.monotonic() - started < 0.05, "no network while open"
    assert outcomes == ["error", "error", "short_circuited"]
    server = stub("tei", port=port)
    time.sleep(1.0)
    assert client.score("q", TEXTS, time.monotonic() + 30).tolist() == [float(len(t)) for t in TEXTS]
    assert client.breaker.state == "closed" and server.requests() == 1


# -- the stage and the runner --------------------------------------------------------------------------------------
def state_with(texts: list[str], timeout_s: float) -> QueryState:
    state = QueryState("q", deadline=time.monotonic() + timeout_s)
    state.candidates = Candidates(rows=np.arange(len(texts)), scores={"cmc": np.arange(len(texts), 0, -1).astype(np.float32)},
                                  texts=list(texts))
    return state


def run(stage, state: QueryState) -> QueryState:
    runners = Runners(BatchConfig())
    try:
        return run_stage(stage, state, runners, {})
    finally:
        runners.close()


def test_the_stage_reranks_its_head_and_records_its_timing(stub):
    server = stub("tei")
    texts = TEXTS + ["tail text that is very long but beyond k"]
    state = run(RemoteCrossEncoderRerank(remote(server.port), index=None, k=3), state_with(texts, 30))
    assert state.ran == ["ce"] and state.skipped == [] and state.counts["ce"] == 3
    assert state.candidates.rows.tolist() == BY_LENGTH + [3], "head by the remote's scores, the tail kept below"
    assert np.isnan(state.candidates.scores["ce"][-1]) and state.timings_ms["ce"] > 0


def test_the_stage_skips_itself_when_the_remote_is_down_and_keeps_the_order():
    state = run(RemoteCrossEncoderRerank(remote(free_port(), retries=0), index=None, k=3), state_with(TEXTS, 30))
    assert state.skipped == ["ce"] and state.ran == [] and state.partial
    assert state.candidates.rows.tolist() == [0, 1, 2] and "ce" not in state.candidates.scores
    assert state.timings_ms["ce"] >= 0
    assert any("remote cross-encoder" in w for w in state.warnings)


def test_the_stage_budget_bounds_the_call(stub):
    server = stub("stall")
    stage = RemoteCrossEncoderRerank(remote(server.port), index=None, k=3, budgets_ms={"ce": 500})
    started = time.monotonic()
    state = run(stage, state_with(TEXTS, 60))
    assert state.skipped == ["ce"] and time.monotonic() - started < 5
