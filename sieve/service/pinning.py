"""Worker CPU pinning (SIEVE_PIN_WORKERS): each worker process binds itself to its own share of the CPUs the server
may use, so that its threads (event loop, request threads, batchers, torch) stay on the same cores.

Why: one process's Python threads take turns on one interpreter lock; spread over several cores, every hand-off
moves the running thread to another core (cold caches, a cross-core wake-up). On a quiet 2-core Intel host with
zero-cost forwards (RESULTS.md), one worker pinned to one core answered 1.55x the requests of the same worker free
to use both, at half the CPU per request. A worker claims a slot, 0 to N-1, with an exclusive lock on a file in the
workers' metrics directory (held while it lives: the worker that replaces a dead one takes the slot it freed) and
takes slot i's share of the allowed CPUs, sorted: CPUs [i*C/N, (i+1)*C/N), or CPU i mod C with more workers than CPUs.
A single process is bound to its first CPU: its forwards then run on that core too (torch's intra-op threads are
started by the pinned threads and inherit their CPU): on one core it answered 1.04x the requests the unpinned
process answered on two with the real models, at 25% less CPU per request, and 1.6x with zero-cost forwards
(RESULTS.md). Off by default: a pinned worker
cannot use a core another process of the host keeps busy, nor the idle core of another worker."""
from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger("sieve")
_held: list = []  # the slot lock of this process, open for its life


def share(cpus: list[int], slot: int, count: int) -> set[int]:
    """Slot `slot` of `count`'s CPUs among `cpus` (sorted)."""
    if count >= len(cpus):
        return {cpus[slot % len(cpus)]}
    return set(cpus[slot * len(cpus) // count:(slot + 1) * len(cpus) // count])


def claim_slot(folder: Path, count: int) -> int | None:
    """The first slot 0..count-1 no living process holds (None: all held), held until this process exits."""
    for slot in range(count):
        handle = open(folder / f"slot-{slot}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _held.append(handle)
        return slot
    return None


def pin_worker(enabled: bool, count: int, folder: Path | None) -> set[int] | None:
    """Bind every thread of this worker process (and the ones it starts later) to its slot's CPUs; a single process
    to its first CPU. The CPUs, or None when not pinned (off, no slot free)."""
    if not enabled or not hasattr(os, "sched_setaffinity") or (count > 1 and folder is None):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if count == 1:
        slot, cpus = 0, {allowed[0]}
    else:
        slot = claim_slot(folder, count)
        if slot is None:
            log.warning("no free CPU slot among %d workers: this worker is not pinned", count)
            return None
        cpus = share(allowed, slot, count)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that ended meanwhile
            pass
    log.info("worker %d pinned to CPUs %s (slot %d of %d)", os.getpid(), sorted(cpus), slot, count)
    return cpus

