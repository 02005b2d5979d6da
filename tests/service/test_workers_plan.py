"""How many worker processes `sieve serve` starts (service/workers.py), without starting any."""
from __future__ import annotations

import pytest

from sieve.cli import build_parser, settings_from
from sieve.service import workers
from sieve.service.config import Settings


@pytest.mark.parametrize("cores, kind, count", [(1, "cpu", 1), (2, "cpu", 2), (3, "cpu", 2), (8, "cpu", 2),
                                                (12, "cpu", 3), (64, "cpu", 4), (1, "cuda", 1), (2, "cuda", 1),
                                                (16, "cuda", 8), (96, "cuda", 8)])
def test_the_automatic_count_follows_cores_and_device(cores, kind, count, monkeypatch):
    monkeypatch.delenv("SIEVE_WORKERS", raising=False)  # tests/conftest.py sets 1 for the suite's servers
    chosen = workers.plan(Settings(), cores=cores, kind=kind)
    assert chosen.count == count and chosen.chosen.startswith(f"auto: {cores} CPU cores, {kind}")


def test_an_in_process_qdrant_gets_one_automatic_worker(monkeypatch, tmp_path):
    """The automatic count never asks for what check_backend refuses: Qdrant's local mode and an Edge shard belong
    to one process."""
    monkeypatch.delenv("SIEVE_WORKERS", raising=False)
    for backend in ({"index_backend": "qdrant-edge", "qdrant_edge_path": str(tmp_path)},
                    {"index_backend": "qdrant", "qdrant_url": str(tmp_path)}):
        chosen = workers.plan(Settings(**backend), cores=8, kind="cpu")
        assert chosen.count == 1 and "one process per folder" in chosen.chosen
        workers.check_backend(Settings(**backend), chosen.count)  # no SystemExit
    assert workers.plan(Settings(index_backend="qdrant", qdrant_url="http://q:6333"), cores=8, kind="cpu").count == 2


def test_a_set_count_wins_and_auto_or_empty_means_unset(monkeypatch):
    assert workers.plan(Settings(workers=3), cores=64, kind="cuda") == workers.Plan(3, "SIEVE_WORKERS")
    for unset in ("auto", ""):
        monkeypatch.setenv("SIEVE_WORKERS", unset)
        assert Settings().workers is None
    args = build_parser().parse_args(["serve", "--workers", "2"])
    assert settings_from(args).workers == 2


def test_a_device_named_cuda_or_cpu_needs_no_probe():
    assert workers.device_kind("cuda:1") == "cuda" and workers.device_kind("cpu") == "cpu"


def test_an_in_process_qdrant_is_refused_for_several_workers(tmp_path):
    edge = Settings(index_backend="qdrant-edge", qdrant_edge_path=tmp_path)
    local = Settings(index_backend="qdrant", qdrant_url=str(tmp_path))
    for settings in (edge, local):
        workers.check_backend(settings, 1)  # one process: fine
        with pytest.raises(SystemExit, match="cannot share"):
            workers.check_backend(settings, 2)
    workers.check_backend(Settings(index_backend="qdrant", qdrant_url="http://qdrant:6333"), 4)


def test_pinning_shares_the_cpus_among_the_slots():
    from sieve.service.pinning import share

    assert [share([0, 1], i, 2) for i in range(2)] == [{0}, {1}]
    assert [share([0, 1, 2, 3], i, 2) for i in range(2)] == [{0, 1}, {2, 3}]
    assert [share([0, 2, 4], i, 2) for i in range(2)] == [{0}, {2, 4}]  # every CPU in one share, none in two
    assert [share([3, 5], i, 3) for i in range(3)] == [{3}, {5}, {3}]  # more workers than CPUs: in turn


def test_a_slot_is_held_while_its_holder_lives_and_freed_when_it_ends(tmp_path):
    """Slots are exclusive locks: taken in order, none twice; a slot a (dead) holder released is taken again."""
    import subprocess
    import sys

    from sieve.service import pinning

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from sieve.service.pinning import claim_slot\n"
                               f"print(claim_slot(Path({str(tmp_path)!r}), 3), flush=True)\ntime.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "0"
        assert pinning.claim_slot(tmp_path, 3) == 1  # 0 is another living process's
    finally:
        holder.kill()
        holder.wait()
    assert pinning.claim_slot(tmp_path, 3) == 0  # freed by its end
    assert pinning.claim_slot(tmp_path, 2) is None  # 0 and 1 are this process's own now
    for path in list(pinning._held):
        pinning.release(path)


def test_pinning_is_off_unless_asked_and_a_single_process_takes_its_first_cpu(tmp_path):
    """Off: nothing claimed or bound. On, one process (run apart: pinning this one would pin the test run): every
    thread of it on its first allowed CPU, threads started later included."""
    import os
    import subprocess
    import sys

    from sieve.service.pinning import pin_worker

    assert pin_worker(False, 2, tmp_path) is None and pin_worker(False, 1, None) is None
    assert pin_worker(True, 2, None) is None  # several workers need the metrics directory for their slots
    assert not list(tmp_path.iterdir())
    code = ("import os, threading\nfrom sieve.service.pinning import pin_worker\n"
            "print(sorted(pin_worker(True, 1, None)))\n"
            "t = threading.Thread(target=lambda: print(sorted(os.sched_getaffinity(0)))); t.start(); t.join()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    first = min(os.sched_getaffinity(0))
    assert out.stdout.split("\n")[:2] == [f"[{first}]", f"[{first}]"], out.stderr
