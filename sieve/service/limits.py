"""Limits that follow the device (issue 32): /rerank's work cap, the default deadline and the cross-encoder's tokens
per forward pass, in force and on /readyz.

Both defaults were sized on 2 CPU cores (config.py: RERANK_MAX_TOKENS_CPU, a 10 s deadline that a /rerank at the cap
fits in). A faster device gets them scaled by its speed-up over those cores, `s` (SIEVE_DEVICE_SPEEDUP, or measured
at start-up on CUDA by a short forward of the bi-encoder: calibrate_speedup):

    deadline = max(DEADLINE_FLOOR_MS, cpu deadline / s)       a request that takes 10 s on the CPU takes 10/s s here
    work cap = cpu cap x s x deadline / cpu deadline            what the device reads in that deadline, as on the CPU

    tokens per cross-encoder pass = cpu tokens per pass x min(s, 32)

so the cap still fits in the deadline (the CPU's invariant), a GPU server admits what it finishes in milliseconds,
and one cross-encoder pass takes no longer than on the reference CPU (the most a request can overrun its deadline in
that stage) while a GPU gets passes wide enough to keep it busy: the CPU's 2,048 tokens are 16 pairs of 128 tokens,
7 passes for a /rerank of 100 documents; 32x is 512 such pairs, one forward of 9.7 ms on an H200 with the shipped
cross-encoder's shape (benchmarks/results/gpu_nvidia_h200_s35_jax_on_gpu.json, micro). On the CPU (or s <= 1) all
three are the settings' values, unchanged. A setting given explicitly (SIEVE_RERANK_MAX_TOKENS,
SIEVE_DEFAULT_TIMEOUT_MS, SIEVE_CE_BATCH_TOKENS) always wins over its scaled default.
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
MAX_CE_BATCH_SCALE = 32  # cross-encoder tokens per pass grow at most this much (65,536 from 2,048)
_CALIBRATION_SHAPE = (32, 128)  # texts x tokens per timed forward


@dataclass(frozen=True)
class Limits:
    rerank_max_tokens: int
    default_timeout_ms: int | None
    ce_batch_tokens: int  # the cross-encoder's pairs x longest pair per forward pass
    speedup: float  # the device's throughput over the reference CPU's (1.0: the CPU defaults)
    source: str  # cpu | setting | calibrated: where `speedup` came from

    def as_dict(self) -> dict:
        return asdict(self)


def cpu_limits(settings: Settings) -> Limits:
    """Today's limits: the settings' values as they are."""
    return Limits(settings.rerank_max_tokens, settings.default_timeout_ms, settings.ce_batch_tokens, 1.0, "cpu")


def scaled_limits(settings: Settings, speedup: float, source: str) -> Limits:
    """The limits for a device `speedup` times the reference CPU; explicitly given settings are kept."""
    if speedup <= 1.0:
        return Limits(settings.rerank_max_tokens, settings.default_timeout_ms, settings.ce_batch_tokens, speedup, source)
    given = settings.model_fields_set
    deadline = settings.default_timeout_ms
    if "default_timeout_ms" not in given and deadline is not None:
        deadline = max(DEADLINE_FLOOR_MS, round(deadline / speedup))
    cap = settings.rerank_max_tokens
    if "rerank_max_tokens" not in given:
        cpu_deadline = Settings.model_fields["default_timeout_ms"].default
        scale = speedup * (deadline or cpu_deadline) / cpu_deadline
        cap = round(RERANK_MAX_TOKENS_CPU * min(MAX_CAP_SCALE, max(1.0, scale)))
    ce_tokens = settings.ce_batch_tokens
    if "ce_batch_tokens" not in given:
        ce_tokens = round(ce_tokens * min(MAX_CE_BATCH_SCALE, speedup))
    return Limits(cap, deadline, ce_tokens, speedup, source)


def device_limits(settings: Settings, device, biencoder=None) -> Limits:
    """The limits in force on `device`: SIEVE_DEVICE_SPEEDUP when set; on CUDA the measured speed-up; else today's."""
    if settings.device_speedup is not None:
        return scaled_limits(settings, settings.device_speedup, "setting")
    if device.type != "cuda" or biencoder is None:
        return cpu_limits(settings)
    speedup = calibrate_speedup(biencoder.module, device)
    limits = scaled_limits(settings, speedup, "calibrated")
    log.info("device speed-up %.1fx over the reference CPU: work cap %d tokens, default deadline %s ms, "
             "cross-encoder passes of %d tokens", speedup, limits.rerank_max_tokens, limits.default_timeout_ms,
             limits.ce_batch_tokens)
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
