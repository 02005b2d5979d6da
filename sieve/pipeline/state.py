"""Per-request state handed from stage to stage."""
from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from sieve.pipeline.candidates import Candidates


class Deadline(float):
    """time.monotonic() by which the answer is due (math.inf: none), that also passes at once when `cancelled` is
    set: the client hung up, nobody will read the answer. A float, so every stage and batch item that holds a copy
    of the request's deadline sees the hang-up too, and checks it where it checks the time (between batches)."""

    cancelled: threading.Event

    def __new__(cls, at: float | None, cancelled: threading.Event | None = None) -> "Deadline":
        deadline = super().__new__(cls, math.inf if at is None else at)
        deadline.cancelled = cancelled or threading.Event()
        return deadline


def expired(deadline: float | None) -> bool:
    """Past the deadline, or the client behind it has gone."""
    if deadline is None:
        return False
    return time.monotonic() > deadline or (isinstance(deadline, Deadline) and deadline.cancelled.is_set())


@dataclass
class QueryState:
    query: str
    candidates: Candidates | None = None
    query_vectors: dict[str, torch.Tensor] = field(default_factory=dict)  # "be", "cmc" -> (d,)
    timings_ms: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # candidates that entered each stage
    warnings: list[str] = field(default_factory=list)
    deadline: float | None = None  # time.monotonic() by which the answer is due (a Deadline); None/inf = none
    timeout_s: float | None = None  # the request's whole budget that deadline came from
    skipped: list[str] = field(default_factory=list)  # stages skipped for lack of time (previous order kept)
    ran: list[str] = field(default_factory=list)  # stages that ranked the candidates, in order
    index: object | None = None  # the index version this request reads from start to end
    use_cache: bool = True  # False: the caller asked for fresh work (Cache-Control: no-cache), no cached vectors
    query_tokens: int | None = None  # the query's tokens for the bi-encoder, once counted (Searcher.counted)
    dense_hits: object | None = None  # the first stage's vector search, done with the query's encoding (a DenseHits,
    # pipeline/dense_batch.py); taken by the stage that asked for it

    @property
    def partial(self) -> bool:
        return bool(self.skipped)

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline (negative once past it or once the client has gone), None without one."""
        if self.cancelled:
            return -1.0
        return None if self.deadline is None or math.isinf(self.deadline) else self.deadline - time.monotonic()

    @property
    def cancelled(self) -> bool:
        """The client hung up: stages still to run are skipped, running ones stop at their next batch."""
        return isinstance(self.deadline, Deadline) and self.deadline.cancelled.is_set()

    def budget_s(self, stage: str, budgets_ms: dict[str, float]) -> float | None:
        """Time this stage may take: the smaller of its own budget and what is left of the request's."""
        limits = [s for s in (self.remaining_s(), budgets_ms.get(stage, 0) / 1000 or None) if s is not None]
        return min(limits) if limits else None

    @contextmanager
    def timed(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings_ms[stage] = self.timings_ms.get(stage, 0.0) + (time.perf_counter() - start) * 1000
