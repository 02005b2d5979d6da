"""How many worker processes `sieve serve` starts (service/workers.py), without starting any."""
from __future__ import annotations

import pytest

from sieve.cli import build_parser, settings_from
from sieve.service import workers
from sieve.service.config import Settings


@pytest.mark.parametrize("cores, kind, count", [(1, "cpu", 1), (2, "cpu", 1), (8, "cpu", 2), (64, "cpu", 4),
                                                (1, "cuda", 1), (2, "cuda", 1), (16, "cuda", 8), (96, "cuda", 8)])
def test_the_automatic_count_follows_cores_and_device(cores, kind, count):
    chosen = workers.plan(Settings(), cores=cores, kind=kind)
    assert chosen.count == count and chosen.chosen.startswith(f"auto: {cores} CPU cores, {kind}")


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
