"""Limits that follow the device (service/limits.py): on a CPU the work cap and default deadline are today's, exactly;
a device s times faster gets them scaled (deadline / s, the cap what it reads in that deadline); settings given
explicitly win; /readyz shows what is in force, and /rerank enforces it."""
from __future__ import annotations

import pytest
import torch

from sieve.service.config import RERANK_MAX_TOKENS_CPU, Settings
from sieve.service.limits import (DEADLINE_FLOOR_MS, MAX_CAP_SCALE, MAX_CE_BATCH_SCALE, calibrate_speedup, cpu_limits,
                                  device_limits, scaled_limits)
from tests.server import Server

BIG = ["lorem ipsum dolor sit amet " * 185 for _ in range(1000)]  # 1,000 documents of 5 KB: ~250,000 tokens


def test_cpu_limits_are_todays_defaults():
    settings = Settings(_env_file=None)
    for limits in (cpu_limits(settings), device_limits(settings, torch.device("cpu"))):
        assert (limits.rerank_max_tokens, limits.default_timeout_ms) == (RERANK_MAX_TOKENS_CPU, 10_000)
        assert RERANK_MAX_TOKENS_CPU == 16_384
        assert limits.ce_batch_tokens == settings.ce_batch_tokens == 2_048
        assert (limits.speedup, limits.source) == (1.0, "cpu")
    given = Settings(_env_file=None, rerank_max_tokens=12_000, default_timeout_ms=3_000)
    assert device_limits(given, torch.device("cpu")).rerank_max_tokens == 12_000


@pytest.mark.parametrize("speedup,cap,deadline,ce_tokens", [
    (0.5, 16_384, 10_000, 2_048),       # slower than the reference: today's limits
    (1.0, 16_384, 10_000, 2_048),
    (4.0, 16_384, 2_500, 8_192),        # deadline / 4; the cap is what 4x reads in a quarter of the time
    (20.0, 32_768, 1_000, 40_960),      # the deadline stops at its floor: 20x reads twice the CPU cap in it
    (50.0, 81_920, 1_000, 65_536),      # cross-encoder passes stop at 32x
    (10_000.0, 16_384 * MAX_CAP_SCALE, 1_000, 2_048 * MAX_CE_BATCH_SCALE),
])
def test_limits_scale_with_a_given_speedup(speedup, cap, deadline, ce_tokens):
    limits = scaled_limits(Settings(_env_file=None), speedup, "setting")
    assert (limits.rerank_max_tokens, limits.default_timeout_ms, limits.ce_batch_tokens) == (cap, deadline, ce_tokens)
    # one cross-encoder pass takes the device no longer than the CPU's pass takes the reference CPU
    assert limits.ce_batch_tokens <= max(1.0, speedup) * 2_048
    assert limits.default_timeout_ms >= DEADLINE_FLOOR_MS
    # the cap still fits in the deadline as it does on the CPU: tokens per second asked of the device <= s x the CPU's
    assert limits.rerank_max_tokens / limits.default_timeout_ms <= max(1.0, speedup) * RERANK_MAX_TOKENS_CPU / 10_000


def test_explicit_settings_win_over_the_scaled_defaults():
    given = Settings(_env_file=None, rerank_max_tokens=5_000, default_timeout_ms=3_000, ce_batch_tokens=4_096)
    both = scaled_limits(given, 20.0, "calibrated")
    assert (both.rerank_max_tokens, both.default_timeout_ms, both.ce_batch_tokens) == (5_000, 3_000, 4_096)
    deadline_only = scaled_limits(Settings(_env_file=None, default_timeout_ms=3_000), 20.0, "calibrated")
    assert (deadline_only.rerank_max_tokens, deadline_only.default_timeout_ms) == (round(16_384 * 20 * 0.3), 3_000)
    setting = device_limits(Settings(_env_file=None, device_speedup=4.0), torch.device("cpu"))
    assert (setting.rerank_max_tokens, setting.default_timeout_ms, setting.source) == (16_384, 2_500, "setting")


def test_calibration_times_a_forward():
    class Pool(torch.nn.Module):  # stands in for a SentenceEncoder: (ids, mask) -> anything
        def forward(self, ids, mask):
            return (ids.float() * mask).mean(dim=1)  # (B,)

    speedup = calibrate_speedup(Pool(), torch.device("cpu"), repeats=1)
    assert speedup > 0 and speedup == speedup  # a positive number, not NaN


def test_readyz_shows_the_limits_in_force(client):
    limits = client.get("/readyz").json()["limits"]
    assert limits == {"rerank_max_tokens": 12_000, "default_timeout_ms": 10_000, "ce_batch_tokens": 2_048,
                      "speedup": 1.0, "source": "cpu"}


def test_a_scaled_server_shows_and_enforces_its_limits(demo_index, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_DEVICE_SPEEDUP": "4", "SIEVE_DEFAULT_TIMEOUT_MS": "10000"},
                 tmp_path_factory.mktemp("logs") / "scaled-server.log")
    try:
        with srv.client() as client:
            limits = client.get("/readyz").json()["limits"]
            assert limits == {"rerank_max_tokens": 65_536, "default_timeout_ms": 10_000, "ce_batch_tokens": 8_192,
                              "speedup": 4.0, "source": "setting"}
            reply = client.post("/rerank", json={"query": "inflammation", "documents": BIG})
            assert reply.status_code == 413, reply.text[:300]
            assert "at most 65536 tokens" in reply.json()["error"]["allowed"]
    finally:
        srv.stop()


def test_a_serving_process_runs_blas_on_one_thread(client):
    """numpy's OpenBLAS defaults to every core; the server's request threads compute small products
    concurrently, which OpenBLAS's thread pool turns into 30-65 ms of CPU each (service/components.py)."""
    assert client.get("/readyz").json()["workers"]["blas_threads"] == 1


def test_the_cross_encoder_packs_passes_by_the_limit_in_force(demo_index):
    """The searcher's cross-encoder passes are the limits' width: SIEVE_CE_BATCH_TOKENS x the speed-up (here a given
    SIEVE_DEVICE_SPEEDUP of 4), or the setting as set."""
    from sieve.service.components import load_components

    for settings, want in ((Settings(_env_file=None, index_dir=demo_index, device_speedup=4.0), 8_192),
                           (Settings(_env_file=None, index_dir=demo_index, device_speedup=4.0, ce_batch_tokens=1_024),
                            1_024)):
        components = load_components(settings)
        try:
            assert components.limits.ce_batch_tokens == want
            assert components.searcher.batching.ce_tokens == want
        finally:
            components.searcher.close()
