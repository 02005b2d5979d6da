"""The server's heap after start-up: collected once, then frozen out of Python's cyclic garbage collector.

Start-up leaves ~460,000 objects tracked by the collector (models, tokenizers, libraries, the index's Python side).
Every full (oldest-generation) collection walks them all: on the AMD Zen 5 host of the sixteenth session each took
~300 ms, and under load one came every ~15 s. The interpreter lock is held throughout, so every request in flight
waited for it: a single zero-cost worker at 16 clients answered its p50 in 19 ms and its p99 in 150-250 ms (RESULTS.md,
issue 32, sixteenth session). `gc.freeze()` moves what exists at that moment into a permanent generation the
collector never walks; what requests and index versions allocate later is collected as before. The cost: a start-up
object dropped later in a reference cycle is never freed (refcounting still frees the rest: a replaced SearchIndex
has no cycle and goes, checked); that is at most what start-up made, once.

The served process also times its collections of generations 1 and 2 (`PauseClock`: `sieve_gc_pause_seconds
{generation}` on /metrics, a panel of deploy/grafana/dashboards/sieve.json), so a pause that comes back shows.

Only the served process does either (`sieve serve`'s single process and each worker: service/app.py `create_app(...,
served_process=True)`). A test process makes and drops many apps; frozen, their cycles would never be freed, and
each app's clock would stay among the collector's callbacks.
"""
from __future__ import annotations

import collections
import gc
import logging
import threading
import time

log = logging.getLogger("sieve.heap")


def settle(pause_histogram) -> "PauseClock":
    """The served process at the end of its start-up: its pauses timed from now on (the freeze's own collection is
    the first), then its start-up objects frozen. Returns the clock, to stop at shutdown."""
    clock = PauseClock(pause_histogram).start()
    freeze_after_startup()
    return clock


def freeze_after_startup() -> int:
    """Collect what start-up left unreachable, then freeze the rest; returns how many objects were frozen."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("froze %d start-up objects out of the garbage collector in %.0f ms", frozen,
             1000 * (time.perf_counter() - started))
    return frozen


class PauseClock:
    """Times each collection of generations 1 and 2 (a gen-0 one is cut short at once: they come hundreds of times
    a second and last microseconds) into `histogram` (label `generation`). The collector's callback only appends
    to a deque: it runs wherever an allocation triggered the collection, possibly inside a lock prometheus-client
    holds, so the histogram is fed from a thread of its own every `flush_s` (and once more when stopped)."""

    def __init__(self, histogram, flush_s: float = 1.0):
        self.children = {g: histogram.labels(generation=str(g)) for g in (1, 2)}  # the series exist from the start
        self.flush_s = flush_s
        self.pending: collections.deque = collections.deque(maxlen=100_000)
        self.started_at = 0.0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sieve-gc-pauses", daemon=True)

    def __call__(self, phase: str, info: dict) -> None:
        generation = info["generation"]
        if generation == 0:
            return
        if phase == "start":
            self.started_at = time.perf_counter()
        else:
            self.pending.append((generation, time.perf_counter() - self.started_at))

    def start(self) -> "PauseClock":
        gc.callbacks.append(self)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
        self.stopping.set()
        self.thread.join(timeout=5)
        self.flush()

    def flush(self) -> None:
        while self.pending:
            generation, seconds = self.pending.popleft()
            self.children[generation].observe(seconds)

    def _run(self) -> None:
        while not self.stopping.wait(self.flush_s):
            self.flush()
