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
cannot use a core another process of the host keeps busy, nor the idle core of another worker.

SIEVE_PIN_INTERPRETER binds only the interpreter's side: every thread of a worker on one CPU of its share (so the
hand-offs between the event loop, request threads and batchers stay on one core), while torch's intra-op threads,
which run the forwards without the interpreter lock, use the whole share (forward_team), and so do the native threads
already running when it pins (the tokenizers' Rust threads, started by start-up's first batch: on a 2-core Intel host
a /rerank of 100 texts with zero-cost forwards answered 1.4-2.0x the pairs/s, RESULTS.md). On a 2-core Zen 3 host one
such process spent 2.6-3.2 ms of CPU per /search with zero-cost forwards (7.5-7.9 unpinned) and answered 1.07x main's
requests with the real models, where the unpinned default gave 0.91x in the same run (RESULTS.md). Each process
takes the first CPU of its share that no other Sieve process of the host has taken for its interpreter (claim_cpu:
a lock file per CPU in /dev/shm), so that two servers started side by side do not stack their interpreters on
one core (two single-worker zero-cost servers on a 2-core Intel host: both on the first CPU 0.49x the unpinned pair's
requests, each on its own 1.16x; RESULTS.md); processes that share no /dev/shm (containers) cannot see each other's
claims. A watch on the interpreter's CPU (core_watch.py, watch_interpreter) moves it when other processes keep that
CPU busy, which made it safe as the default: SIEVE_PIN_INTERPRETER unset or `auto` pins a worker whose share has 2 to
AUTO_MAX_CPUS CPUs (Zen 4, 2 cores: 1.86x main's zero-cost requests, 1.07x with the real models; RESULTS.md), and
each of several workers that get one CPU each (no more workers than CPUs): such a worker runs wholly on its CPU, as
with SIEVE_PIN_WORKERS, and its watch may move it to any CPU the server may use that no other interpreter claimed,
or unpin it (Zen 4, 2 cores, each worker on its own listening socket: 2 workers 1.69x one worker's zero-cost
requests, 1.12x the same workers unpinned; RESULTS.md)."""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from pathlib import Path

from sieve.service.core_watch import CoreWatch, all_threads, python_threads

CLAIMS = Path("/dev/shm") if Path("/dev/shm").is_dir() else None  # host-wide: where interpreter CPUs are claimed
log = logging.getLogger("sieve")
LATE_PIN_S = 600.0  # a worker that found every slot held waits this long for one (pin_later)
AUTO_MAX_CPUS = 4  # SIEVE_PIN_INTERPRETER=auto pins a worker whose share has 2 to this many CPUs (measured with 2)
_held: dict[Path, object] = {}  # the locks this process holds (its worker slot, its interpreter CPU), open for its life
# SIEVE_PIN_INTERPRETER: (the interpreter's CPU, the worker's share, where CPUs are claimed, the CPUs its watch may
# move it to); the share is also where the forwards' thread teams run (forward_team)
_interpreter: tuple[int, list[int], Path | None, list[int]] | None = None
_watch = None  # the CoreWatch on the interpreter's CPU (watch_interpreter)
_watch_lock = threading.Lock()  # the end of start-up and pin_later's thread may both start it


def share(cpus: list[int], slot: int, count: int) -> set[int]:
    """Slot `slot` of `count`'s CPUs among `cpus` (sorted)."""
    if count >= len(cpus):
        return {cpus[slot % len(cpus)]}
    return set(cpus[slot * len(cpus) // count:(slot + 1) * len(cpus) // count])


def hold(path: Path) -> bool:
    """An exclusive lock on `path`, held while this process lives (False: another holder, or no such file can be
    made here)."""
    try:
        handle = open(path, "a")
    except OSError:  # another user's lock file, a folder that is gone
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _held[path] = handle
    return True


def release(path: Path) -> None:
    """Give back a lock `hold` took (nothing when this process does not hold it)."""
    handle = _held.pop(path, None)
    if handle is not None:
        handle.close()


def claim_slot(folder: Path, count: int) -> int | None:
    """The first slot 0..count-1 no living process holds (None: all held), held until this process exits."""
    return next((slot for slot in range(count) if hold(folder / f"slot-{slot}.lock")), None)


def claim_cpu(cpus: list[int], folder: Path | None) -> int:
    """The first of `cpus` (sorted) whose interpreter no other process has claimed: an exclusive lock on
    folder/sieve-interpreter-cpu-N.lock, held while this process lives; the first of them when every one is held
    (or `folder` is None)."""
    if folder is None:
        return cpus[0]
    return next((cpu for cpu in cpus if hold(cpu_lock(folder, cpu))), cpus[0])


def cpu_lock(folder: Path, cpu: int) -> Path:
    return folder / f"sieve-interpreter-cpu-{cpu}.lock"


def auto_interpreter(share_cpus: int, count: int = 1, allowed: int | None = None) -> bool:
    """SIEVE_PIN_INTERPRETER=auto: pin a worker's interpreter when its share has 2 to AUTO_MAX_CPUS CPUs, or when
    each of `count` > 1 workers has a CPU of its own among the `allowed` ones."""
    if count > 1 and share_cpus == 1:
        return allowed is not None and count <= allowed
    return 2 <= share_cpus <= AUTO_MAX_CPUS


def pin_worker(enabled: bool, count: int, folder: Path | None, interpreter: bool | None = False,
               claims: Path | None = CLAIMS) -> set[int] | None:
    """Bind every thread of this worker process (and the ones it starts later) to its slot's CPUs; a single process
    to its first CPU. `interpreter` (SIEVE_PIN_INTERPRETER): the slot's share is every allowed CPU for a single
    process, and the threads are bound to one CPU of the share only (the first one not claimed in `claims` by
    another process: claim_cpu), while the threads that run model forwards give their OpenMP teams the whole share
    (forward_team). `interpreter` None (auto): so when the share has 2 to AUTO_MAX_CPUS CPUs. The CPUs the threads
    are bound to, or None when not pinned (off, no slot free)."""
    if not hasattr(os, "sched_setaffinity") or (count > 1 and folder is None):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if interpreter is None:
        interpreter = auto_interpreter(len(allowed) if count == 1 else len(share(allowed, 0, count)), count, len(allowed))
    if not (enabled or interpreter):
        return None
    if count == 1:
        slot, cpus = 0, set(allowed) if interpreter else {allowed[0]}
    else:
        slot = claim_slot(folder, count)
        if slot is None:
            log.warning("no free CPU slot among %d workers (a rolling restart: the worker this one replaces still "
                        "holds it): this worker is pinned once one is free", count)
            threading.Thread(target=pin_later, args=(count, folder, interpreter, claims, allowed), name="pin-later",
                             daemon=True).start()
            return None
        cpus = share(allowed, slot, count)
    bound = {claim_cpu(sorted(cpus), claims)} if interpreter else cpus
    if interpreter:  # native threads so far (library pools: the tokenizers' Rust threads) keep the share, as pin_later
        bind(all_threads() - python_threads(), cpus)
        bind(python_threads(), bound)
        note_interpreter(min(bound), cpus, claims, count, allowed, slot)
    else:
        bind(all_threads(), bound)
        log.info("worker %d pinned to CPUs %s (slot %d of %d)", os.getpid(), sorted(cpus), slot, count)
    return bound


def bind(tids: set[int], cpus: set[int]) -> None:
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def note_interpreter(cpu: int, cpus: set[int], claims: Path | None, count: int, allowed: list[int], slot: int) -> None:
    """Records where the interpreter is pinned (a worker alone on one CPU may be moved to any the server may use)."""
    global _interpreter
    _interpreter = (cpu, sorted(cpus), claims, sorted(cpus) if len(cpus) > 1 or count == 1 else allowed)
    log.info("worker %d: interpreter threads pinned to CPU %s, forwards on CPUs %s (slot %d of %d)", os.getpid(), cpu,
             sorted(cpus), slot, count)


def pin_later(count: int, folder: Path, interpreter: bool, claims: Path | None, allowed: list[int],
              wait_s: float = LATE_PIN_S, every_s: float = 0.5) -> None:
    """pin_worker for a worker that found every slot held at its start (SIGHUP's rolling restart starts each new
    worker while the one it replaces still runs): once a slot frees, every thread goes to its CPUs (with
    `interpreter` and a share of several, the Python threads then to one CPU of it; forward teams made meanwhile keep
    the share) and the interpreter's watch starts."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(every_s)
        slot = claim_slot(folder, count)
        if slot is None:
            continue
        cpus = share(allowed, slot, count)
        bind(all_threads(), cpus)
        if not interpreter:
            log.info("worker %d pinned to CPUs %s (slot %d of %d), once it was free", os.getpid(), sorted(cpus), slot,
                     count)
            return
        cpu = claim_cpu(sorted(cpus), claims)
        bind(python_threads(), {cpu})
        note_interpreter(cpu, cpus, claims, count, allowed, slot)
        watch_interpreter()
        return
    log.warning("no CPU slot was freed in %.0f s: this worker stays unpinned", wait_s)


def watch_interpreter():
    """A CoreWatch (service/core_watch.py) on the interpreter's CPU, started, when pin_worker pinned it to one CPU of
    several it may move to; else None. One per process: a watch already running is returned."""
    global _watch
    with _watch_lock:
        if _interpreter is None or len(_interpreter[3]) < 2:
            return None
        if _watch is not None and _watch.running():
            return _watch
        cpu, cpus, claims, room = _interpreter
        whole = len(cpus) == 1  # a worker alone on its CPU: every thread goes where the interpreter goes
        if claims is None:
            _watch = CoreWatch(cpu, room, whole=whole)
        else:
            _watch = CoreWatch(cpu, room, claim=lambda c: hold(cpu_lock(claims, c)),
                               release=lambda c: release(cpu_lock(claims, c)), whole=whole)
        return _watch.start()


def interpreter_status() -> dict | None:
    """/readyz `workers.interpreter`: the interpreter's CPU, the share, and what its watch did; None when the
    interpreter is not pinned."""
    if _interpreter is None:
        return None
    cpu, cpus, _, _ = _interpreter
    if _watch is None:
        return {"cpu": cpu, "share": cpus}
    return {"cpu": _watch.cpu, "share": cpus, "moves": _watch.moves, "unpins": _watch.unpins}


def forward_team() -> None:
    """Called once by each thread that runs model forwards (the batchers: pipeline/batching.py `on_thread_start`),
    before its first. With SIEVE_PIN_INTERPRETER it makes the thread's OpenMP team (torch's intra-op threads) now,
    while the thread may run on the worker's whole share: the team's threads are created with that affinity and
    keep it (libgomp keeps one team per calling thread; a new thread inherits its creator's CPUs), then the thread
    itself goes back to the interpreter's CPU. So the interpreter's hand-offs stay on one core and the forwards
    use them all. Otherwise nothing."""
    if _interpreter is None or len(_interpreter[1]) < 2:
        return
    cpus = set(_interpreter[1])
    import torch

    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        if torch.get_num_threads() > 1:
            torch.ones(1 << 20).mul_(2.0)  # one parallel region (1M elements: above ATen's grain size)
    finally:
        os.sched_setaffinity(0, own)

