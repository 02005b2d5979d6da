"""The server's heap after start-up: collected once, then frozen out of Python's cyclic garbage collector.

Start-up leaves ~460,000 objects tracked by the collector (models, tokenizers, libraries, the index's Python side).
Every full (oldest-generation) collection walks them all: on the AMD Zen 5 host of the sixteenth session each took
~300 ms, and under load one came every ~15 s. The interpreter lock is held throughout, so every request in flight
waited for it: a single zero-cost worker at 16 clients answered its p50 in 19 ms and its p99 in 150-250 ms (RESULTS.md,
issue 32, sixteenth session). `gc.freeze()` moves what exists at that moment into a permanent generation the
collector never walks; what requests and index versions allocate later is collected as before. The cost: a start-up
object dropped later in a reference cycle is never freed (refcounting still frees the rest: a replaced SearchIndex
has no cycle and goes, checked); that is at most what start-up made, once.

Only the served process does this (`sieve serve`'s single process and each worker: service/app.py `create_app(...,
freeze_heap=True)`). A test process makes and drops many apps; frozen, their cycles would never be freed.
"""
from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("sieve.heap")


def freeze_after_startup() -> int:
    """Collect what start-up left unreachable, then freeze the rest; returns how many objects were frozen."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("froze %d start-up objects out of the garbage collector in %.0f ms", frozen,
             1000 * (time.perf_counter() - started))
    return frozen
