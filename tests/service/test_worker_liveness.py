"""What the supervisor and /readyz take for a live worker (service/workers.py, service/supervisor.py), with real
processes: one that exited but is not yet reaped is not ready, and one that dies while the supervisor waits for its
answer to a ping is seen dead then, not after the whole health-check timeout."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time

from uvicorn.config import Config

from sieve.service import workers
from sieve.service.supervisor import WorkerProcess, answers


def test_an_exited_worker_not_yet_reaped_is_neither_alive_nor_ready(tmp_path, monkeypatch):
    """A worker SIGKILLed stays a zombie until the supervisor waits for it: its marker must not count meanwhile."""
    monkeypatch.setenv(workers.METRICS_ENV, str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while not workers.zombie(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert workers.zombie(child.pid)  # exited, not reaped: kill(pid, 0) still succeeds
        os.kill(child.pid, 0)
        (tmp_path / f"worker-{child.pid}{workers.READY_SUFFIX}").touch()
        (tmp_path / f"worker-{os.getpid()}{workers.READY_SUFFIX}").touch()
        assert not workers.alive(child.pid) and workers.alive(os.getpid())
        assert workers.ready_count() == 1
    finally:
        child.wait()
    assert not workers.alive(child.pid)


def never_answers() -> None:
    time.sleep(600)


def test_a_worker_that_dies_while_pinged_is_seen_dead_at_once():
    """uvicorn's ping waits out its timeout for a worker that dies after the ping was sent (no EOF comes: the
    supervisor holds both ends of the pipe); `answers` wakes on the process's exit."""
    process = WorkerProcess(Config("sieve.service.app:worker_app"), [])
    process.process = multiprocessing.get_context("spawn").Process(target=never_answers)  # never reads its pings
    process.start()
    result = []
    asking = threading.Thread(target=lambda: result.append(answers(process, timeout=600)))
    try:
        asking.start()
        time.sleep(0.5)
        assert asking.is_alive()  # waiting for an answer that does not come
        process.process.kill()
        asking.join(timeout=60)
        assert not asking.is_alive() and result == [False]
    finally:
        process.kill()
        process.join()
