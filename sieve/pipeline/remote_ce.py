"""The cross-encoder stage run by another server: Hugging Face TEI, infinity, anything that speaks Cohere's rerank
API, or another Sieve serving its cross-encoder. The top K' texts go out in one HTTP call instead of through an
in-process model.

- one pooled httpx.Client per server process (thread-safe; every request thread shares its connections);
- each call's timeout is what is left of the request's deadline (or of the stage budget, or `timeout_s` when the
  request has none); failed calls are retried with exponential backoff only while time remains;
- a circuit breaker (pipeline/circuit_breaker.py) refuses calls at once after consecutive failures;
- when the remote is down, late, or the breaker is open, the stage skips itself like an in-process stage that ran
  out of time: the candidates keep the previous stage's order, `"ce"` goes to state.skipped, a warning says why.
"""
from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np

from sieve.models.cross_encoder import PairLengths
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.circuit_breaker import CircuitBreaker
from sieve.pipeline.state import QueryState

log = logging.getLogger("sieve.pipeline")
SHAPES = ("cohere", "tei", "sieve")
DEFAULT_PATHS = {"cohere": "/v2/rerank", "tei": "/rerank", "sieve": "/rerank"}  # when the URL names no path
RETRY_STATUS = {408, 429}  # and every 5xx
MIN_ATTEMPT_S = 0.005  # a retry that would have less time than this is not tried


@dataclass(frozen=True)
class RemoteConfig:
    url: str  # the rerank endpoint; a bare http://host:port gets the shape's usual path
    shape: str = "sieve"
    model: str = "ce"  # the `model` field of cohere and sieve requests (TEI has none)
    api_key: str | None = None  # sent as `Authorization: Bearer`
    timeout_s: float = 10.0  # longest one call may take when the request gives no deadline
    retries: int = 2
    backoff_s: float = 0.05  # first wait before a retry; doubled each time
    failures_to_open: int = 5
    open_s: float = 10.0
    max_connections: int = 64
    lengths: PairLengths = field(default_factory=PairLengths)  # what /rerank counts a text as (SIEVE_RERANK_MAX_TOKENS)

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"remote cross-encoder shape {self.shape!r}: expected one of {', '.join(SHAPES)}")


class RemoteFailed(Exception):
    """A call that gave no scores. `outcome` names why (metrics label); `breaker`: whether it counts against the
    remote (down, late, broken answer) or not (the remote refused this one request with a 4xx)."""

    def __init__(self, outcome: str, detail: str, breaker: bool = True):
        super().__init__(detail)
        self.outcome, self.detail, self.breaker = outcome, detail, breaker


def endpoint_url(url: str, shape: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"remote cross-encoder URL {url!r}: expected http(s)://host[:port][/path]")
    path = parts.path if parts.path.strip("/") else DEFAULT_PATHS[shape]
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def public_url(url: str) -> str:
    """The URL without user:password, for /readyz and logs."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.hostname + (f":{parts.port}" if parts.port else ""), parts.path, "", ""))


# -- shapes: request body and how to read the scores back --------------------------------------------------------
def request_body(shape: str, model: str, query: str, texts: list[str], timeout_ms: int) -> dict:
    if shape == "cohere":  # Cohere v2 /v2/rerank, infinity /rerank
        return {"model": model, "query": query, "documents": texts, "top_n": len(texts)}
    if shape == "tei":  # raw logits, as the in-process cross-encoder scores
        return {"query": query, "texts": texts, "raw_scores": True, "truncate": True}
    return {"model": model, "query": query, "documents": texts, "timeout_ms": max(1, timeout_ms)}


def read_scores(shape: str, body, n: int) -> np.ndarray:
    """(n,) scores in the order the texts were sent; ValueError on any answer that does not give all n."""
    if shape == "tei":
        pairs = [(r["index"], r["score"]) for r in body]
    else:
        if shape == "sieve" and body.get("partial"):
            raise RemoteFailed("late", "the remote Sieve skipped its cross-encoder for lack of time")
        pairs = [(r["index"], r["relevance_score"]) for r in body["results"]]
    scores = np.full(n, np.nan, dtype=np.float32)
    for index, score in pairs:
        if not isinstance(index, int) or not 0 <= index < n or not isinstance(score, (int, float)) \
                or not math.isfinite(score):
            raise ValueError(f"bad result index={index!r} score={score!r}")
        scores[index] = score
    if np.isnan(scores).any():
        raise ValueError(f"{int(np.isnan(scores).sum())} of {n} texts have no score")
    return scores


class RemoteCrossEncoder:
    """Scores (query, text) pairs on a remote server. `on_outcome(outcome)` is called once per call (ok, error,
    timeout, late, rejected, malformed, short_circuited) and `on_retry()` once per retry: the service counts them."""

    def __init__(self, config: RemoteConfig, transport: httpx.BaseTransport | None = None):
        self.config = config
        self.endpoint = endpoint_url(config.url, config.shape)
        self.name = f"remote:{config.shape}"
        self.lengths = config.lengths
        self.breaker = CircuitBreaker(config.failures_to_open, config.open_s)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        limits = httpx.Limits(max_connections=config.max_connections, max_keepalive_connections=config.max_connections)
        self.client = httpx.Client(headers=headers, limits=limits, transport=transport)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # else one INFO line per call: the access log twice over
        self.on_outcome: Callable[[str], None] = lambda outcome: None
        self.on_retry: Callable[[], None] = lambda: None

    def close(self) -> None:
        self.client.close()

    def identity(self) -> list:
        """What the scores depend on (the service's cache fingerprint)."""
        return [self.name, public_url(self.endpoint), self.config.model]

    def status(self) -> dict:
        return {"url": public_url(self.endpoint), "shape": self.config.shape, "model": self.config.model,
                **self.breaker.status()}

    def score(self, query: str, texts: list[str], deadline: float) -> np.ndarray:
        """(len(texts),) scores, or RemoteFailed. `deadline`: time.monotonic() by which the answer is due."""
        if not texts:
            return np.empty(0, dtype=np.float32)
        if not self.breaker.allow():
            self.on_outcome("short_circuited")
            raise RemoteFailed("short_circuited", "circuit breaker open after consecutive failures", breaker=False)
        try:
            scores = self.call_with_retries(query, texts, deadline)
        except Exception as exc:  # anything unforeseen too: a half-open probe must always report back
            failed = exc if isinstance(exc, RemoteFailed) else RemoteFailed("error", f"{type(exc).__name__}: {exc}")
            self.breaker.failure() if failed.breaker else self.breaker.success()
            self.on_outcome(failed.outcome)
            if failed is exc:
                raise
            raise failed from exc
        self.breaker.success()
        self.on_outcome("ok")
        return scores

    def call_with_retries(self, query: str, texts: list[str], deadline: float) -> np.ndarray:
        wait = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            try:
                return self.call(query, texts, deadline - time.monotonic())
            except RemoteFailed as exc:
                retryable = exc.outcome == "error"
                pause = wait * random.uniform(0.5, 1.0)  # jitter: replicas do not retry in step
                if not retryable or attempt == self.config.retries or \
                        deadline - time.monotonic() - pause < MIN_ATTEMPT_S:
                    raise
                log.info("remote cross-encoder: %s; retry %d in %.0f ms", exc.detail, attempt + 1, pause * 1000)
                self.on_retry()
                time.sleep(pause)
                wait *= 2
        raise AssertionError("unreachable")

    def call(self, query: str, texts: list[str], timeout_s: float) -> np.ndarray:
        if timeout_s <= 0:
            raise RemoteFailed("timeout", "no time left for the remote cross-encoder")
        shape = self.config.shape
        body = request_body(shape, self.config.model, query, texts, int(timeout_s * 1000))
        try:
            response = self.client.post(self.endpoint, json=body, timeout=timeout_s)
        except httpx.TimeoutException as exc:
            raise RemoteFailed("timeout", f"no answer within {timeout_s * 1000:.0f} ms ({type(exc).__name__})")
        except httpx.HTTPError as exc:
            raise RemoteFailed("error", f"{type(exc).__name__}: {exc}")
        if response.status_code in RETRY_STATUS or response.status_code >= 500:
            raise RemoteFailed("error", f"HTTP {response.status_code}")
        if response.status_code >= 400:
            raise RemoteFailed("rejected", f"HTTP {response.status_code}: {response.text[:300]}", breaker=False)
        try:
            return read_scores(shape, response.json(), len(texts))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RemoteFailed("malformed", f"answer not in the {shape} shape: {exc}")


WARNINGS = {"short_circuited": "the remote cross-encoder is failing (circuit breaker open)",
            "timeout": "the remote cross-encoder did not answer in time",
            "late": "the remote cross-encoder did not answer in time",
            "rejected": "the remote cross-encoder refused the request",
            "malformed": "the remote cross-encoder's answer could not be read",
            "error": "the remote cross-encoder is unreachable or failing"}


class RemoteCrossEncoderRerank:
    """Drop-in for stages.CrossEncoderRerank (same name "ce", skippable) that scores the first `k` candidates on a
    remote server. Unbatched: the runner calls it directly; it times itself under "ce" (the one latency histogram
    of the stage) and skips itself when the remote gives no scores in time."""

    name = "ce"
    skippable = True

    def __init__(self, remote: RemoteCrossEncoder, index, k: int, budgets_ms: dict[str, float] | None = None):
        self.cross_encoder = remote  # as on the in-process stage: /rerank reads `.lengths` from it
        self.index = index
        self.k = k
        self.budgets_ms = budgets_ms or {}

    def texts(self, candidates: Candidates, n: int) -> list[str]:
        if candidates.texts is not None:
            return candidates.texts[:n]
        return [doc.full_text for doc in self.index.documents(candidates.rows[:n])]

    def deadline(self, state: QueryState) -> float:
        budget = state.budget_s(self.name, self.budgets_ms)
        limit = self.cross_encoder.config.timeout_s if budget is None else min(budget, self.cross_encoder.config.timeout_s)
        return time.monotonic() + limit

    def __call__(self, state: QueryState) -> QueryState:
        n = min(self.k, len(state.candidates))
        state.counts[self.name] = n
        with state.timed(self.name):
            deadline = self.deadline(state)
            try:
                scores = self.cross_encoder.score(state.query, self.texts(state.candidates, n), deadline)
            except RemoteFailed as exc:
                log.warning("remote cross-encoder skipped: %s (%s)", exc.outcome, exc.detail)
                state.warnings.append(f"{WARNINGS[exc.outcome]}; the previous order is kept")
                state.skipped.append(self.name)
                return state
        state.candidates = state.candidates.rerank_head(self.name, scores)
        state.candidates.validate()
        return state
