"""SIEVE_PIN_INTERPRETER: a worker's Python threads on one CPU, the forwards' OpenMP threads on every CPU of its
share. Run in a child process: affinity is per thread and would outlive the test in pytest's own process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.server import REPO

CHILD = r"""
import json, os, threading
import torch
from sieve.pipeline.batching import Runners
from sieve.service import pinning

torch.set_num_threads(2)
from pathlib import Path
from sieve.service.core_watch import all_threads, python_threads
before = sorted(all_threads() - python_threads())  # native threads torch started on import, if any
bound = pinning.pin_worker(False, 1, None, interpreter=True, claims=Path(os.environ["CLAIMS"]))
runners = Runners()
runners.on_thread_start = pinning.forward_team if os.environ.get("FORWARD_TEAM") else None
batcher = runners.get("forward", lambda items: [float(torch.ones(1 << 20).mul_(3.0).sum()) for _ in items])
assert batcher.submit(1).result(60) == 3.0 * (1 << 20)
cpus = {int(tid): sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}
print(json.dumps({"bound": sorted(bound), "main": os.getpid(), "batcher": batcher.thread.native_id,
                  "cpus": cpus, "before": before}))
"""


def run_child(forward_team: bool, claims) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLAIMS": str(claims), **({"FORWARD_TEAM": "1"} if forward_team else {})}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["cpus"] = {int(tid): cpus for tid, cpus in got["cpus"].items()}
    return got


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: there is no second core to keep apart")
def test_interpreter_threads_on_one_cpu_forward_team_on_all(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    got = run_child(forward_team=True, claims=tmp_path)
    first = [allowed[0]]
    assert got["bound"] == first
    assert got["cpus"][got["main"]] == first and got["cpus"][got["batcher"]] == first
    team = [tid for tid, cpus in got["cpus"].items() if tid not in (got["main"], got["batcher"]) and cpus == allowed]
    assert team, f"no OpenMP thread of the batcher may use every CPU: {got['cpus']}"
    # without the batcher's start hook its OpenMP team inherits the interpreter's single CPU (native threads that
    # were there before the pin keep the share: test_native_threads_started_before_the_pin_keep_the_share)
    plain = run_child(forward_team=False, claims=tmp_path)
    assert all(cpus == first for tid, cpus in plain["cpus"].items() if tid not in plain["before"]), plain["cpus"]


def test_interpreters_of_two_processes_take_different_cpus(tmp_path):
    """claim_cpu: the first CPU nobody holds (a lock per CPU, as another process's open file holds it), the first
    of all when every one is held; a folder it cannot write leaves the choice to the first CPU."""
    from sieve.service import pinning

    held = open(tmp_path / "sieve-interpreter-cpu-3.lock", "a")  # another server's interpreter on CPU 3
    import fcntl

    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert pinning.claim_cpu([3, 5, 7], tmp_path) == 5
        assert pinning.claim_cpu([3, 5, 7], tmp_path) == 7  # this process's own claim on 5 counts too
        assert pinning.claim_cpu([3, 5, 7], tmp_path) == 3  # all held: the first, as without claims
        assert pinning.claim_cpu([3, 5, 7], None) == 3
        assert pinning.claim_cpu([4], tmp_path / "missing") == 4
    finally:
        held.close()


NATIVE_CHILD = r"""
import json, os
from pathlib import Path
from transformers import AutoTokenizer
from sieve.models.text_encoder import token_counter
from sieve.models.weights import default_model_path
from sieve.service import pinning
from sieve.service.core_watch import all_threads, python_threads

counter = token_counter(AutoTokenizer.from_pretrained(str(default_model_path())))
counter.encode_batch(["the tokenizers' own threads start on a parallel batch"] * 256)  # start-up's tokenizing
native = sorted(all_threads() - python_threads())
bound = pinning.pin_worker(False, 1, None, interpreter=True, claims=Path(os.environ["CLAIMS"]))
print(json.dumps({"bound": sorted(bound), "native": native, "python": sorted(python_threads()),
                  "cpus": {tid: sorted(os.sched_getaffinity(tid)) for tid in all_threads()}}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: there is no second core to keep apart")
def test_native_threads_started_before_the_pin_keep_the_share(tmp_path):
    """The tokenizers' Rust threads (started by start-up's first batch) tokenize without the interpreter lock: they
    keep the worker's share while every Python thread goes to the interpreter's CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLAIMS": str(tmp_path), "TOKENIZERS_PARALLELISM": "true"}
    out = subprocess.run([sys.executable, "-c", NATIVE_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    cpus = {int(tid): value for tid, value in got["cpus"].items()}
    assert got["native"], "the tokenizer started no thread of its own"
    assert all(cpus[tid] == allowed for tid in got["native"] if tid in cpus), cpus
    assert all(cpus[tid] == got["bound"] == [allowed[0]] for tid in got["python"] if tid in cpus), cpus
