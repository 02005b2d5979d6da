"""The batchers' and the index writer's queues return from get(timeout=...) by the deadline. CPython's
queue.SimpleQueue does not always (3.11 and later): when the getting thread is preempted inside the call past its
deadline, the remaining wait it computes is negative, which its lock reads as "wait forever", and the get blocks
until the next put. In the suite that hung a test on an idle query batcher. The stress below (a busy process on
the same CPU, many 1 us gets) made SimpleQueue hang 12-25 times in 50,000 gets (1-8 in 20,000); a correct queue never waits near
the watchdog's period."""
from __future__ import annotations

import queue
import subprocess
import sys
import textwrap

from sieve.pipeline.batching import Batcher

STRESS = textwrap.dedent("""
    import importlib, os, queue, subprocess, sys, threading, time
    module, name = sys.argv[1].rsplit(".", 1)
    make = getattr(importlib.import_module(module), name)
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\\nwhile True: pass"])
    q, stop = make(), threading.Event()
    def unblock():  # a put every 0.5 s releases a get that hangs
        while not stop.wait(0.5):
            q.put(0)
    threading.Thread(target=unblock, daemon=True).start()
    hung = 0
    try:
        for _ in range(int(sys.argv[2])):
            q.put(1)
            q.get()
            started = time.monotonic()
            try:
                q.get(timeout=1e-6)
            except queue.Empty:
                pass
            hung += time.monotonic() - started > 0.25
    finally:
        stop.set()
        busy.kill()
    print(hung)
""")


def hangs(queue_class: type, gets: int = 50_000) -> int:
    """Timed gets of `queue_class` that waited > 0.25 s (their deadline: 1 us) under the stress above."""
    name = f"{queue_class.__module__}.{queue_class.__qualname__}"
    done = subprocess.run([sys.executable, "-c", STRESS, name, str(gets)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_a_batcher_queue_returns_by_its_deadline():
    batcher = Batcher("t", lambda items: items, max_size=4, max_wait_ms=1.0)
    try:
        assert hangs(type(batcher.queue)) == 0
    finally:
        batcher.close()


def test_the_index_writer_queue_returns_by_its_deadline():
    import inspect

    from sieve.service import updates

    source = inspect.getsource(updates.IndexUpdater.__init__)
    assert "queue.Queue()" in source and "SimpleQueue()" not in source  # the class the stress below clears
    assert hangs(queue.Queue) == 0
