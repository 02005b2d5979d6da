"""Runs one stage of a request under its time budget, batched with other requests when the stage declares a
batched entry point (see pipeline/stages.py). A skippable stage that cannot finish in time is skipped: the
candidates keep the previous stage's order and the state records the skip."""
from __future__ import annotations

import logging
from concurrent.futures import TimeoutError as FutureTimeout

from sieve.pipeline.batching import Runners
from sieve.pipeline.state import QueryState

log = logging.getLogger("sieve.pipeline")


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
        try:
            result = future.result(timeout=budget)
        except FutureTimeout:
            future.cancel()  # dropped unless its batch already started
            result = None
    if result is None:
        return skip(stage, state)
    state = stage.finish(state, result)
    state.ran.append(stage.name)
    return state
