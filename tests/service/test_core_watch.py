"""The watch on a pinned interpreter's CPU (service/core_watch.py): what it reads, what it decides, and a real
busy process on the interpreter's CPU that makes it move (in a child process: affinity outlives a test)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from sieve.service import core_watch
from sieve.service.core_watch import STAY, UNPIN, CoreWatch, candidates, outside_share
from tests.server import REPO

TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nowhere to move to")


def test_outside_work_is_what_the_process_cannot_account_for():
    """busy seconds per CPU minus this process's threads bound there, minus every second of its threads that may
    run anywhere (a lower bound of other processes' work), as a share of the window."""
    own = {1: (0.30, frozenset({0})), 2: (0.10, frozenset({0})), 3: (0.20, frozenset({0, 1})), 4: (0.5, frozenset({1}))}
    got = outside_share({0: 0.9, 1: 0.8}, own, [0, 1], wall_s=1.0)
    assert got == pytest.approx({0: 0.9 - 0.4 - 0.2, 1: 0.8 - 0.5 - 0.2})
    assert outside_share({0: 0.1}, own, [0], wall_s=1.0) == {0: 0.0}  # never below 0


def test_the_interpreter_moves_to_the_least_used_free_cpu():
    assert candidates({0: 0.2, 1: 0.0}, current=0) == []  # at or below the bar: stay
    assert candidates({0: 0.9, 1: 0.5, 2: 0.1, 3: 0.2}, current=0) == [2, 3]  # 1 is busy too
    assert candidates({0: 0.9, 1: 0.9}, current=0) == []


def fake_watch(claimable=(0, 1, 2, 3), patience=2):
    released, bound = [], []
    watch = CoreWatch(0, [0, 1, 2, 3], claim=lambda cpu: cpu in claimable, release=released.append, patience=patience)
    watch.bind = lambda only, cpus, also=(): bound.append(cpus) or set()  # the affinity calls: on a real process below
    return watch, released, bound


QUIET = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}


def test_it_waits_for_patience_windows_in_a_row_then_moves_and_gives_its_claim_back():
    watch, released, bound = fake_watch()
    busy = {0: 0.8, 1: 0.0, 2: 0.5, 3: 0.1}
    assert watch.step(busy, busy, now=0) == STAY  # 1 window over the bar
    assert watch.step({0: 0.1, 1: 0.0, 2: 0.0, 3: 0.0}, QUIET, now=1) == STAY  # quiet again: the count starts over
    assert watch.step(busy, busy, now=2) == STAY
    assert watch.step(busy, busy, now=3) == 1
    assert (watch.cpu, watch.moves, released, bound) == (1, 1, [0], [{1}])
    busy_1 = {0: 0.0, 1: 0.9, 2: 0.0, 3: 0.0}
    for now in range(4, 13):  # within the cooldown nothing moves
        assert watch.step(busy_1, busy_1, now=now) == STAY
    assert watch.step(busy_1, busy_1, now=14) == STAY and watch.step(busy_1, busy_1, now=15) == 0


def test_a_cpu_another_sieve_claimed_is_skipped_and_with_none_free_it_unpins_then_pins_again_later():
    watch, released, bound = fake_watch(claimable=(3,), patience=1)
    assert watch.step({0: 0.8, 1: 0.0, 2: 0.5, 3: 0.1}, QUIET, now=0) == 3  # 1 is the least used, but claimed
    watch, released, bound = fake_watch(claimable=(), patience=1)
    hog = {0: 0.8, 1: 0.0, 2: 0.0, 3: 0.0}
    assert watch.step(hog, hog, now=0) == UNPIN
    assert (watch.cpu, watch.unpins, bound, released) == (None, 1, [{0, 1, 2, 3}], [0])
    assert watch.step(hog, hog, now=core_watch.RETRY_S - 1) == STAY  # unpinned until the retry
    assert watch.step(hog, hog, now=core_watch.RETRY_S) == STAY  # nothing free to claim: again a retry later
    watch.claim = lambda cpu: cpu in (0, 2)
    assert watch.step(hog, {0: 0.9, 1: 0.2, 2: 0.3, 3: 0.1}, now=2 * core_watch.RETRY_S) == 2  # least busy, free
    assert (watch.cpu, watch.moves, bound[-1]) == (2, 1, {2})


CHILD = r"""
import json, os, sys, time, threading
from pathlib import Path
from sieve.service import core_watch, pinning
core_watch.WINDOW_S = 0.25
bound = pinning.pin_worker(False, 1, None, interpreter=None, claims=Path(os.environ["CLAIMS"]))
worker = threading.Thread(target=lambda: time.sleep(30), daemon=True)  # a thread started after pinning
worker.start()
first = min(bound)
print(json.dumps({"first": first, "share": sorted(os.sched_getaffinity(0))}), flush=True)
watch = pinning.watch_interpreter()
watch.window_s, watch.patience = 0.25, 2
sys.stdin.readline()  # the test's busy process is on our CPU now
deadline = time.monotonic() + 20
while time.monotonic() < deadline and watch.moves == 0 and not watch.unpins:
    time.sleep(0.05)
print(json.dumps({"moves": watch.moves, "unpins": watch.unpins, "main": sorted(os.sched_getaffinity(0)),
                  "worker": sorted(os.sched_getaffinity(worker.native_id)), "status": pinning.interpreter_status()}),
      flush=True)
"""


@TWO_CPUS
def test_a_busy_process_on_the_interpreters_cpu_moves_it(tmp_path):
    """The automatic default pins a 2-4 CPU process's interpreter to its first CPU; a process spinning on that CPU
    makes the watch move every interpreter thread (one started after pinning too) to another CPU."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLAIMS": str(tmp_path)}
    allowed = sorted(os.sched_getaffinity(0))[:4]
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, preexec_fn=lambda: os.sched_setaffinity(0, allowed))
    hog = None
    try:
        start = json.loads(child.stdout.readline())
        assert start["share"] == [start["first"]] and start["first"] == allowed[0]
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                               preexec_fn=lambda: os.sched_setaffinity(0, {start["first"]}))
        time.sleep(0.5)
        child.stdin.write("go\n")
        child.stdin.flush()
        got = json.loads(child.stdout.readline())
    finally:
        if hog is not None:
            hog.kill()
        child.kill()
    if got["unpins"]:  # every other CPU was busy too (another job on this host): the share, as unpinned
        assert got["main"] == got["worker"] == allowed and got["status"]["cpu"] is None, got
        return
    assert got["moves"] == 1, got
    moved = got["main"]
    assert len(moved) == 1 and moved[0] in allowed and moved[0] != start["first"], got
    assert got["worker"] == moved
    assert got["status"] == {"cpu": moved[0], "share": allowed, "moves": 1, "unpins": 0}


@pytest.mark.parametrize("cpus, pinned", [(1, False), (2, True), (3, True), (4, True), (5, False), (16, False)])
def test_auto_pins_a_share_of_two_to_four_cpus(cpus, pinned):
    from sieve.service.pinning import auto_interpreter

    assert auto_interpreter(cpus) is pinned


TEAM_MEMBER = r"""
import json, os, sys
from pathlib import Path
from sieve.service import pinning
bound = pinning.pin_worker(False, 2, Path(os.environ["SLOTS"]), interpreter=None, claims=Path(os.environ["CLAIMS"]))
watch = pinning.watch_interpreter()
print(json.dumps({"bound": sorted(bound), "main": sorted(os.sched_getaffinity(0)), "status": pinning.interpreter_status(),
                  "room": watch.share, "whole": watch.whole}), flush=True)
watch.stop()
sys.stdin.readline()  # holds its slot and CPU until the other worker has reported too
"""


@TWO_CPUS
def test_two_workers_on_two_cpus_each_run_on_their_own_and_may_be_moved_to_either(tmp_path):
    """The automatic default for 2 workers on 2 CPUs: each worker wholly on the CPU of its slot (a CPU each), and its
    watch may move it to any CPU the server may use (the other is claimed by the other worker's interpreter, so
    under contention it unpins instead)."""
    allowed = sorted(os.sched_getaffinity(0))[:2]
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLAIMS": str(tmp_path / "claims"), "SLOTS": str(tmp_path)}
    (tmp_path / "claims").mkdir()
    team = [subprocess.Popen([sys.executable, "-c", TEAM_MEMBER], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, allowed))
            for _ in range(2)]
    try:
        got = [json.loads(member.stdout.readline()) for member in team]
    finally:
        for member in team:
            member.kill()
    assert sorted(g["bound"][0] for g in got) == allowed, got
    for g in got:
        assert len(g["bound"]) == 1 and g["main"] == g["bound"], g
        assert g["status"]["share"] == g["bound"] and g["status"]["cpu"] == g["bound"][0], g
        assert g["room"] == allowed and g["whole"], g


@pytest.mark.parametrize("count, allowed, pinned", [(2, 2, True), (4, 4, True), (3, 2, False), (8, 4, False)])
def test_auto_pins_each_of_several_workers_with_a_cpu_of_its_own(count, allowed, pinned):
    """Several workers with one CPU each (no more workers than CPUs) are pinned, each wholly on its CPU; more workers
    than CPUs would stack two on one, and are left to the scheduler."""
    from sieve.service.pinning import auto_interpreter, share

    assert len(share(list(range(allowed)), 0, count)) == 1
    assert auto_interpreter(1, count, allowed) is pinned


OWN_WORK = r"""
import json, os, threading, time
from pathlib import Path
from sieve.service import pinning
from sieve.service.core_watch import busy_s
bound = pinning.pin_worker(False, 1, None, interpreter=None, claims=Path(os.environ["CLAIMS"]))
share = pinning._interpreter[1]
def spin(cpus):
    if cpus:
        os.sched_setaffinity(0, cpus)
    end = time.monotonic() + 3
    while time.monotonic() < end:
        sum(range(1000))
threads = [threading.Thread(target=spin, args=(c,)) for c in (None, share)]  # pinned, and one free on the share
watch = pinning.watch_interpreter()
watch.window_s, watch.patience = 0.25, 2
windows, last = [], [sum(busy_s().values()), time.process_time(), time.monotonic()]
step = watch.step
def reading(outside, busy, now):  # each window: what the watch saw beside what other processes did on any CPU
    machine, own, wall = sum(busy_s().values()), time.process_time(), time.monotonic()
    others = max(0.0, (machine - last[0]) - (own - last[1])) / max(wall - last[2], 1e-9)
    last[:] = machine, own, wall
    if all(t.is_alive() for t in threads):  # a thread that ended is missing from the watch's own count
        windows.append({"outside": outside.get(watch.cpu) if watch.cpu is not None else None, "others": others})
    return step(outside, busy, now)
watch.step = reading
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"moves": watch.moves, "unpins": watch.unpins, "first": min(bound),
                  "main": sorted(os.sched_getaffinity(0)), "windows": windows}))
"""


@TWO_CPUS
def test_the_process_own_work_never_moves_it(tmp_path):
    """Busy threads of the process itself, pinned and free (a forward team), are not other processes' work: in no
    window does the watch see more outside work on the interpreter's CPU than other processes did on all CPUs
    together (both read from /proc in 10 ms ticks, so within a tick per CPU), and on a machine that was otherwise
    quiet it never moves. Other processes may well be busy (tests run two at a time): then a move is right."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLAIMS": str(tmp_path)}
    allowed = sorted(os.sched_getaffinity(0))[:4]
    out = subprocess.run([sys.executable, "-c", OWN_WORK], env=env, capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: os.sched_setaffinity(0, allowed))
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    windows = got.pop("windows")
    assert len(windows) >= 3, windows  # 3 s of work; the first window is 1 s (set before the test shortens it)
    slack = 0.01 * os.cpu_count() / 0.25 + 0.05  # a tick of each CPU's count per window, and the reads' skew
    assert all(w["outside"] is None or w["outside"] <= w["others"] + slack for w in windows), windows
    assert got["first"] == allowed[0]
    if max(w["others"] for w in windows) < 0.1:  # nothing else ran: the spinning threads alone never move it
        assert got == {"moves": 0, "unpins": 0, "first": allowed[0], "main": [allowed[0]]}, windows


REPIN = r"""
import json, os, threading, time
from sieve.service.core_watch import CoreWatch
share = sorted(os.sched_getaffinity(0))
worker = threading.Thread(target=lambda: time.sleep(5), daemon=True)
worker.start()
watch = CoreWatch(None, share)
target = share[-1]
got = watch.repin({cpu: (0.0 if cpu == target else 0.9) for cpu in share}, now=0.0)
print(json.dumps({"got": got, "main": sorted(os.sched_getaffinity(0)),
                  "worker": sorted(os.sched_getaffinity(worker.native_id)), "target": target}))
"""


@TWO_CPUS
def test_pinning_again_binds_every_python_thread_to_the_least_busy_cpu():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", REPIN], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["got"] == got["target"] and got["main"] == got["worker"] == [got["target"]]


REPIN_NATIVE = r"""
import _thread, json, os, sys, threading, time
from sieve.service.core_watch import CoreWatch
share = sorted(os.sched_getaffinity(0))
born = []
_thread.start_new_thread(lambda: (born.append(threading.get_native_id()), time.sleep(5)), ())  # no threading.Thread
while not born:
    time.sleep(0.01)
watch = CoreWatch(None, share, whole=sys.argv[1] == "whole")
target = share[-1]
watch.repin({cpu: (0.0 if cpu == target else 0.9) for cpu in share}, now=0.0)
print(json.dumps({"main": sorted(os.sched_getaffinity(0)), "native": sorted(os.sched_getaffinity(born[0])),
                  "target": target, "share": share}))
"""


@TWO_CPUS
@pytest.mark.parametrize("whole", [True, False])
def test_a_worker_alone_on_its_cpu_takes_every_thread_along_when_pinned_again(whole):
    """A thread threading does not know (as a native library starts them) that was born while the interpreter was
    unpinned: pinned again with it when the whole worker follows its interpreter (a worker with a CPU of its own),
    left on the share otherwise (where such threads are forward teams that belong there)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", REPIN_NATIVE, "whole" if whole else "python"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["main"] == [got["target"]]
    assert got["native"] == ([got["target"]] if whole else got["share"]), got


LATE = r"""
import _thread, json, os, sys, threading, time
from pathlib import Path
from sieve.service import pinning
bound = pinning.pin_worker(False, 2, Path(os.environ["SLOTS"]), interpreter=None, claims=Path(os.environ["CLAIMS"]))
born = []
_thread.start_new_thread(lambda: (born.append(threading.get_native_id()), time.sleep(30)), ())  # a model's thread
while not born:
    time.sleep(0.01)
print(json.dumps({"bound": bound, "status": pinning.interpreter_status()}), flush=True)
sys.stdin.readline()  # the test has let go of slot 1
deadline = time.monotonic() + 30
while time.monotonic() < deadline and pinning.interpreter_status() is None:
    time.sleep(0.05)
print(json.dumps({"status": pinning.interpreter_status(), "main": sorted(os.sched_getaffinity(0)),
                  "native": sorted(os.sched_getaffinity(born[0]))}), flush=True)
"""


@TWO_CPUS
def test_a_worker_that_found_every_slot_held_is_pinned_once_one_frees(tmp_path):
    """SIGHUP's rolling restart starts each new worker while the one it replaces still holds its CPU slot: the new
    worker starts unpinned and takes the slot (every thread, one a native library started included) when the old
    worker lets go of it."""
    from sieve.service import pinning

    allowed = sorted(os.sched_getaffinity(0))[:2]
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLAIMS": str(tmp_path / "claims"), "SLOTS": str(tmp_path)}
    (tmp_path / "claims").mkdir()
    slots = [tmp_path / f"slot-{i}.lock" for i in range(2)]
    assert all(pinning.hold(slot) for slot in slots)  # the two workers being replaced
    child = subprocess.Popen([sys.executable, "-c", LATE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, preexec_fn=lambda: os.sched_setaffinity(0, allowed))
    try:
        first = json.loads(child.stdout.readline())
        assert first == {"bound": None, "status": None}  # nothing free: not pinned (yet)
        pinning.release(slots[1])
        child.stdin.write("go\n")
        child.stdin.flush()
        got = json.loads(child.stdout.readline())
    finally:
        child.kill()
        pinning.release(slots[0])
        pinning.release(slots[1])
    assert got["status"] is not None and got["status"]["cpu"] == allowed[1] and got["status"]["share"] == [allowed[1]]
    assert got["main"] == got["native"] == [allowed[1]], got


def test_one_watch_per_process_and_a_stopped_one_is_replaced(monkeypatch):
    """The end of start-up and a late pinning (pinning.pin_later) may both ask for the watch: one runs."""
    from sieve.service import pinning

    monkeypatch.setattr(pinning, "_interpreter", (0, [0], None, [0, 1]))  # alone on CPU 0, may move to 1
    monkeypatch.setattr(pinning, "_watch", None)
    monkeypatch.setattr(core_watch, "PATIENCE", (10_000, 10_000))  # it never acts during the test
    first = pinning.watch_interpreter()
    try:
        assert first.running() and pinning.watch_interpreter() is first
    finally:
        first.stop()
    assert not first.running()
    second = pinning.watch_interpreter()
    try:
        assert second is not first and second.running()
    finally:
        second.stop()
