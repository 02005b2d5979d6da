"""The watch on the interpreter's CPU (SIEVE_PIN_INTERPRETER): a pinned interpreter cannot move away from a core that
other processes keep busy, so a thread of the worker looks once a second and moves it when they do.

Each window it reads how long every CPU of the worker's share was busy (/proc/stat: user, nice, system, irq,
softirq; not steal, which no move inside the machine avoids) and how much of that this process accounts for: its
threads bound to that CPU alone, plus all the CPU time of its threads that may run anywhere in the share (torch's
forward teams: an upper bound of what they spent there). What is left is other processes' work on that CPU, a lower
bound (`outside`). When it is above BUSY_SHARE of the window on the interpreter's CPU for `patience` windows in a row
(drawn from PATIENCE at random, so two servers that stack on one core do not move in step), the interpreter's
threads (every thread bound to that CPU alone, those it started included, native ones too) move to the CPU of the
share with the least outside work, when that one is below the bar and no other Sieve process has claimed it for its
interpreter (pinning.claim_cpu); otherwise they are unpinned (the whole share, as without the setting). Contention
that passes (another process starting up, a burst of another service) does not unpin for long: RETRY_S after
unpinning, the threads it freed (and every Python thread) are pinned again to the share's least busy CPU that is free
to claim, and the watch judges that CPU as before (under contention that lasts, the interpreter is pinned about half
the time, 3-6 s at a time, on a CPU it shares: measured no worse than unpinned there, RESULTS.md). After a move it
waits COOLDOWN_S before acting again, so two servers that keep meeting move at most once per cooldown. Reading /proc
costs about 1.2 ms of CPU a window with 40 threads (0.1% of a core; one-off timing, Zen 4).
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

WINDOW_S = 1.0
BUSY_SHARE = 0.3  # other processes' share of the interpreter's CPU that counts as contention
PATIENCE = (3, 6)  # windows in a row above the bar before acting: drawn once per watch, both ends included
COOLDOWN_S = 10.0  # after a move, no other action for this long
RETRY_S = 5.0  # after unpinning, pin again this much later (on the least busy free CPU)
NOTE_EVERY_S = 600.0  # at most one warning this often; the rest at debug level
STAY, UNPIN = "stay", "unpin"
log = logging.getLogger("sieve")


def busy_s(stat: str = "/proc/stat") -> dict[int, float]:
    """CPU -> seconds it has been busy since boot (user + nice + system + irq + softirq)."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    with open(stat) as handle:
        for line in handle:
            if line.startswith("cpu") and line[3].isdigit():
                f = line.split()
                user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f[1:8])
                out[int(f[0][3:])] = (user + nice + system + irq + softirq) / tick
    return out


def all_threads() -> set[int]:
    """This process's thread ids, native ones (OpenMP teams, library pools) included."""
    return {int(name) for name in os.listdir("/proc/self/task")}


def python_threads() -> set[int]:
    """The thread ids of this process's Python threads (those threading knows)."""
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def own_threads() -> dict[int, tuple[float, frozenset[int]]]:
    """This process's threads: tid -> (CPU seconds so far, the CPUs it may run on)."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for name in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{name}/stat").read_text().rsplit(")", 1)[1].split()
            out[int(name)] = ((int(fields[11]) + int(fields[12])) / tick, frozenset(os.sched_getaffinity(int(name))))
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue
    return out


def outside_share(busy: dict[int, float], own: dict[int, tuple[float, frozenset[int]]], share: list[int],
                  wall_s: float) -> dict[int, float]:
    """busy: CPU -> busy seconds over the window; own: tid -> (CPU seconds over the window, its CPUs). For each CPU of
    the share, other processes' work on it as a share of the window, a lower bound (never below 0)."""
    loose = sum(spent for spent, cpus in own.values() if len(cpus) > 1)
    out = {}
    for cpu in share:
        bound_here = sum(spent for spent, cpus in own.values() if cpus == {cpu})
        out[cpu] = max(0.0, busy.get(cpu, 0.0) - bound_here - loose) / max(wall_s, 1e-9)
    return out


def candidates(outside: dict[int, float], current: int, bar: float = BUSY_SHARE) -> list[int]:
    """[] while other processes leave the interpreter's CPU alone (at most `bar` of it); else the CPUs it could move
    to, those other processes use at most `bar`, least used first (ties: lowest CPU)."""
    if outside.get(current, 0.0) <= bar:
        return []
    return [cpu for share, cpu in sorted((s, c) for c, s in outside.items() if c != current and s <= bar)]


@dataclass
class CoreWatch:
    """Watches `cpu` (the interpreter's; None once unpinned) within `share` (the CPUs it may move to: the worker's
    share, or every CPU the server may use for one of several workers with a CPU each). `claim(cpu)`: whether
    this process may take that CPU for its interpreter (pinning.claim_cpu's lock); `release(cpu)` gives one back."""
    cpu: int | None
    share: list[int]
    claim: Callable[[int], bool] = lambda cpu: True
    release: Callable[[int], None] = lambda cpu: None
    whole: bool = False  # every thread of the process follows the interpreter (a worker alone on one CPU)
    window_s: float = WINDOW_S
    bar: float = BUSY_SHARE
    patience: int = field(default_factory=lambda: random.randint(*PATIENCE))
    cooldown_s: float = COOLDOWN_S
    retry_s: float = RETRY_S
    moves: int = 0  # moves to another CPU, re-pinnings after an unpin included
    unpins: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _over: int = 0  # windows in a row above the bar
    _idle_until: float = 0.0  # no action before this (monotonic seconds)
    _noted: float = 0.0  # when the last warning was logged
    _unpinned: set[int] = field(default_factory=set)  # the threads the last unpin freed: pinned again with the rest

    def start(self) -> "CoreWatch":
        self._thread = threading.Thread(target=self.run, name="core-watch", daemon=True)
        self._thread.start()
        return self

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def run(self) -> None:
        try:
            before, own_before, t0 = busy_s(), own_threads(), time.monotonic()
            while not self._stop.wait(self.window_s):
                busy, own, t1 = busy_s(), own_threads(), time.monotonic()
                spent = {tid: (s - own_before[tid][0] if tid in own_before else s, cpus)
                         for tid, (s, cpus) in own.items()}
                delta = {cpu: b - before.get(cpu, b) for cpu, b in busy.items()}
                wall = max(t1 - t0, 1e-9)
                self.step(outside_share(delta, spent, self.share, wall),
                          {cpu: delta.get(cpu, 0.0) / wall for cpu in self.share}, t1)
                before, own_before, t0 = busy, own, t1
        except Exception:  # noqa: BLE001 - the watch is an optimisation: the server goes on as it is
            log.exception("the interpreter's CPU watch stopped")

    def step(self, outside: dict[int, float], busy: dict[int, float], now: float) -> str | int:
        """One window's reading (other processes' share of each CPU, and each CPU's busy share) at `now` -> what
        was done: STAY, the CPU the interpreter now runs on, or UNPIN."""
        if now < self._idle_until:
            return STAY
        if self.cpu is None:
            return self.repin(busy, now)
        contended = outside.get(self.cpu, 0.0) > self.bar
        self._over = self._over + 1 if contended else 0
        if not contended or self._over < self.patience:
            return STAY
        self._over = 0
        choice = next((cpu for cpu in candidates(outside, self.cpu, self.bar) if self.claim(cpu)), UNPIN)
        if choice == UNPIN:
            self.note(now, "the interpreter's CPU %d is busy with other processes (%.0f%% of it) and no other CPU of %s "
                      "is free: the interpreter is unpinned, and pinned again in %.0f s", self.cpu,
                      100 * outside[self.cpu], self.share, self.retry_s)
            self._unpinned = self.bind({self.cpu}, set(self.share))
            self.release(self.cpu)
            self.cpu, self.unpins, self._idle_until = None, self.unpins + 1, now + self.retry_s
            return UNPIN
        self.note(now, "the interpreter's CPU %d is busy with other processes (%.0f%% of it): moved to CPU %d",
                  self.cpu, 100 * outside[self.cpu], choice)
        self.bind({self.cpu}, {choice})
        self.release(self.cpu)
        self.cpu, self.moves, self._idle_until = choice, self.moves + 1, now + self.cooldown_s
        return choice

    def repin(self, busy: dict[int, float], now: float) -> str | int:
        """Unpinned: the Python threads go back onto the least busy CPU of the share that is free to claim."""
        target = next((cpu for _, cpu in sorted((b, c) for c, b in busy.items()) if self.claim(cpu)), None)
        if target is None:
            self._idle_until = now + self.retry_s
            return STAY
        self.bind(None, {target}, self._unpinned)
        self.note(now, "the interpreter is pinned again, to CPU %d", target)
        self.cpu, self.moves, self._idle_until = target, self.moves + 1, now + self.cooldown_s
        return target

    def note(self, now: float, message: str, *args) -> None:
        """A warning, then the same kind of news at debug level for NOTE_EVERY_S (contention that lasts makes the
        watch unpin and pin again every 10-20 s; /readyz counts them)."""
        loud = now - self._noted >= NOTE_EVERY_S or not self._noted
        log.log(logging.WARNING if loud else logging.DEBUG, message, *args)
        if loud:
            self._noted = now

    def bind(self, only: set[int] | None, cpus: set[int], also: set[int] = frozenset()) -> set[int]:
        """Threads bound to `only` alone (those the interpreter's threads started, native ones included; forward
        teams keep their share), or with `only` None every Python thread and the threads in `also` (those an unpin
        freed), now run on `cpus`; with `whole`, `only` None binds every thread (native ones started while unpinned
        too). The threads moved."""
        tids = python_threads() | set(also) if only is None and not self.whole else all_threads()
        moved = set()
        for tid in tids:
            try:
                if only is None or os.sched_getaffinity(tid) == only:
                    os.sched_setaffinity(tid, cpus)
                    moved.add(tid)
            except OSError:  # a thread that ended meanwhile
                pass
        return moved
