"""Runs one stage of a request under its time budget, batched with other requests when the stage declares a
batched entry point (see pipeline/stages.py). A skippable stage that cannot finish in time is skipped: the
candidates keep the previous stage's order and the state records the skip."""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Callable

from sieve.pipeline.batching import Runners
from sieve.pipeline.state import QueryState

log = logging.getLogger("sieve.pipeline")
POLL_S = 0.1  # how soon a waiter notices that its client hung up


def result_within(future: Future, budget: float | None, gone: Callable[[], bool]):
    """The future's result, or None once `budget` seconds have passed (None: no limit) or `gone()` is true (looked
    at every POLL_S); the future itself is left as it is."""
    end = None if budget is None else time.monotonic() + budget
    while True:
        step = POLL_S if end is None else max(0.0, min(POLL_S, end - time.monotonic()))
        try:
            return future.result(timeout=step)
        except FutureTimeout:
            if gone() or (end is not None and time.monotonic() >= end):
                return None


def wait(future: Future, budget: float | None, state: QueryState):
    """The stage's result, or None once the budget is spent or the client has gone; the future is then cancelled
    (dropped before its forward pass unless its batch already started; a running batch drops it at its next chunk)."""
    result = result_within(future, budget, lambda: state.cancelled)
    if result is None:
        future.cancel()  # no effect on a future that is done (a stage's own None result)
    return result


def skip(stage, state: QueryState) -> QueryState:
    state.skipped.append(stage.name)
    return state


def run_stage(stage, state: QueryState, runners: Runners, budgets_ms: dict[str, float]) -> QueryState:
    skippable = getattr(stage, "skippable", False)
    budget = state.budget_s(stage.name, budgets_ms) if skippable else None
    if budget is not None and budget <= 0:
        return skip(stage, state)
    if getattr(stage, "batch_key", None) is None:
        state = stage(state)
        if stage.name not in state.skipped:  # an unbatched stage may skip itself (pipeline/remote_ce.py)
            state.ran.append(stage.name)
        return state
    with state.timed(stage.name):
        compute = getattr(stage, "compute_each", stage.compute)  # reply-as-done: answers each item as it finishes
        future = runners.get(stage.batch_key, compute).submit(stage.prepare(state))
        result = wait(future, budget, state)
    if result is None:
        return skip(stage, state)
    state = stage.finish(state, result)
    state.ran.append(stage.name)
    return state
