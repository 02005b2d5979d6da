"""Limits that follow the device (issue 32): /rerank's work cap and the default deadline, in force and on /readyz.

Both defaults were sized on 2 CPU cores (config.py: RERANK_MAX_TOKENS_CPU, a 10 s deadline that a /rerank at the cap
fits in). A faster device gets them scaled by its speed-up over those cores, `s` (SIEVE_DEVICE_SPEEDUP, or measured
at start-up on CUDA by a short forward of the bi-encoder: calibrate_speedup):

    deadline = max(DEADLINE_FLOOR_MS, cpu deadline / s)       a request that takes 10 s on the CPU takes 10/s s here
    work cap = cpu cap x s x deadline / cpu deadline            what the device reads in that deadline, as on the CPU

so the cap still fits in the deadline (the CPU's invariant) and a GPU server admits what it finishes in
milliseconds. On the CPU (or s <= 1) both are the settings' values, unchanged. A setting given explicitly
(SIEVE_RERANK_MAX_TOKENS, SIEVE_DEFAULT_TIMEOUT_MS) always wins over its scaled default.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from sieve.service.config import RERANK_MAX_TOKENS_CPU, Settings

log = logging.getLogger("sieve")

# What the reference CPU reads per second in the bi-encoder's document tower: the 2-core Intel Xeon (AMX) of
# benchmarks/results/rerank_cap.json read 8,766 tokens in about 8.1 s at a load average near 20 (the host the
# default cap was checked on). A rough anchor; SIEVE_DEVICE_SPEEDUP replaces the measured ratio.
REFERENCE_TOKENS_PER_S = 1_100.0
DEADLINE_FLOOR_MS = 1_000  # never below: HTTP, tokenization and the first stage do not get faster with the device
MAX_CAP_SCALE = 64  # the work cap grows at most this much: request bodies and host memory do not scale with the GPU
_CALIBRATION_SHAPE = (32, 128)  # texts x tokens per timed forward


@dataclass(frozen=True)
class Limits:
    rerank_max_tokens: int
    default_timeout_ms: int | None
    speedup: float  # the device's throughput over the reference CPU's (1.0: the CPU defaults)
    source: str  # cpu | setting | calibrated: where `speedup` came from

    def as_dict(self) -> dict:
        return asdict(self)


def cpu_limits(settings: Settings) -> Limits:
    """Today's limits: the settings' values as they are."""
    return Limits(settings.rerank_max_tokens, settings.default_timeout_ms, 1.0, "cpu")


def scaled_limits(settings: Settings, speedup: float, source: str) -> Limits:
    """The limits for a device `speedup` times the reference CPU; explicitly given settings are kept."""
    if speedup <= 1.0:
        return Limits(settings.rerank_max_tokens, settings.default_timeout_ms, speedup, source)
    given = settings.model_fields_set
    deadline = settings.default_timeout_ms
    if "default_timeout_ms" not in given and deadline is not None:
        deadline = max(DEADLINE_FLOOR_MS, round(deadline / speedup))
    cap = settings.rerank_max_tokens
    if "rerank_max_tokens" not in given:
        cpu_deadline = Settings.model_fields["default_timeout_ms"].default
        scale = speedup * (deadline or cpu_deadline) / cpu_deadline
        cap = round(RERANK_MAX_TOKENS_CPU * min(MAX_CAP_SCALE, max(1.0, scale)))
    return Limits(cap, deadline, speedup, source)


def device_limits(settings: Settings, device, biencoder=None) -> Limits:
    """The limits in force on `device`: SIEVE_DEVICE_SPEEDUP when set; on CUDA the measured speed-up; else today's."""
    if settings.device_speedup is not None:
        return scaled_limits(settings, settings.device_speedup, "setting")
    if device.type != "cuda" or biencoder is None:
        return cpu_limits(settings)
    speedup = calibrate_speedup(biencoder.module, device)
    limits = scaled_limits(settings, speedup, "calibrated")
    log.info("device speed-up %.1fx over the reference CPU: work cap %d tokens, default deadline %s ms",
             speedup, limits.rerank_max_tokens, limits.default_timeout_ms)
    return limits


def calibrate_speedup(module, device, repeats: int = 3) -> float:
    """Tokens per second of `module` (a SentenceEncoder) over a fixed batch on `device`, over the reference CPU's."""
    import torch

    batch, length = _CALIBRATION_SHAPE
    ids = torch.full((batch, length), 1000, dtype=torch.long, device=device)  # (B, T); content does not matter
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        module(ids, mask)  # warm-up: kernels chosen, memory allocated
        _sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            module(ids, mask)
        _sync(device)
    per_s = batch * length * repeats / (time.perf_counter() - start)
    return per_s / REFERENCE_TOKENS_PER_S


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
