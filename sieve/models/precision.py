"""Lower precision where the hardware has it, guarded by rank agreement with fp32.

Chosen once at start-up by the caller (never inside model code), per stage:
- CUDA: fp16 weights (more mantissa than bf16, so rankings move less).
- CPU with native bf16 (AVX-512 BF16 on AMD, AMX on Intel, and oneDNN says so: `native_bf16`): bf16 weights.
- CPU with int8 kernels (fbgemm / x86 engine: AVX2, faster with AVX-512 VNNI): dynamic int8 quantisation of the
  linear layers (weights int8, activations quantised per batch), everything else fp32; offered only where the
  caller allows it (CMC): the MiniLM towers lose too much rank agreement in int8 (Spearman 0.93-0.97 on the probes,
  docs/performance.md), so a CPU without native bf16 runs them in fp32.
- otherwise, or with SIEVE_PRECISION=fp32: fp32.
bf16 without native support is emulated and 2-4x slower than fp32, so it is never picked on such a CPU.
bf16 attention on a CPU runs chunked (models/attention.py) unless the CPU has AMX (chunked_attention_pays).

The guard: the lowered model scores fixed probe inputs (the caller's `probe`) and is kept only when every
probe's Spearman rank correlation with the fp32 scores is >= MIN_SPEARMAN; otherwise the stage stays fp32 and
the record says why. On a CPU it must also not be pathologically slower: each scores the probe again, timed (the
lowered model twice, its faster run counted), and one that took more than MAX_SLOWDOWN x fp32's time and MIN_EXTRA_S
more stays fp32 (on an NVIDIA H200 machine's 16-core Intel CPU the bf16 query tower took 1.6 s per /search where
fp32 stages took milliseconds, and the server 60 s to start against 17 s on the GPU:
benchmarks/results/gpu_nvidia_h200.json). Both bounds, so that timing noise on a busy host does not flip a choice
(it would take two stalls of 0.5 s in a row): a probe of 0.3 ms read 0.7-1.5x in int8 on a Zen 3 host.
Models stay pure: a lowered model is a new module, the fp32 one is untouched.
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from sieve.models.attention import LowPrecisionAttention

MODES = ("auto", "fp32")
MIN_SPEARMAN = 0.99
MAX_SLOWDOWN = 2.0  # a lowered model slower than this x fp32 on the probe, and by MIN_EXTRA_S, is refused
MIN_EXTRA_S = 0.5
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
Probe = Callable[[nn.Module], np.ndarray]  # module -> scores (P, N) of fixed inputs: P rankings of N items


@dataclass(frozen=True)
class Choice:
    """What a stage runs in, and why."""

    dtype: str  # fp32 | bf16 | fp16 | int8
    reason: str
    spearman: float | None = None  # worst probe's rank correlation with fp32; None when not lowered
    runtime: str = "torch"  # torch | openvino (models/openvino_scorer.py)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The value of /proc/cpuinfo's first `name` line ("flags", "vendor_id", ...), "" where there is none."""
    if not cpuinfo.exists():
        return ""
    line = next((line for line in cpuinfo.read_text().splitlines() if line.split(":", 1)[0].strip() == name), "")
    return line.split(":", 1)[-1].strip()


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    return set(cpu_field("flags", cpuinfo).split())


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 faster than fp32: AVX-512 BF16 on AMD (Zen 4 / Zen 5: 2.4x fp32's matmul rate,
    docs/performance.md), AMX on Intel. An Intel CPU that shows avx512_bf16 without amx_bf16 (a VM that hides AMX:
    family 6 model 207, RESULTS.md, forty-sixth session) multiplied bf16 at 0.40x fp32's rate in torch (104 against
    257 GFLOP/s, 2048 x 2048, 2 threads) and ran the bf16 towers on their probes 2.1-2.3x slower than fp32, so it
    counts as without."""
    flags = cpu_flags()
    if cpu_field("vendor_id") == "GenuineIntel" and "amx_bf16" not in flags:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & flags) and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def int8_kernels() -> bool:
    return bool({"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines)) and "avx2" in cpu_flags()


def chunked_attention_pays() -> bool:
    """Whether a lowered module's bf16/fp16 attention on this CPU should run chunked (models/attention.py) rather than
    in torch's fused kernel. With AMX (amx_bf16) the fused kernel multiplies on AMX tiles (oneDNN brgemm) and is
    2.3-3.1x faster than chunked (Intel host, CMC and cross-encoder shapes, docs/performance.md); with AVX-512 BF16
    alone (AMD Zen 4 / Zen 5) it runs bf16 no faster than fp32 and chunked is 1.5-2.8x faster."""
    return "amx_bf16" not in cpu_flags()


def best_dtype(device: torch.device, mode: str = "auto", int8: bool = True) -> tuple[str, str]:
    """(dtype, reason) for a stage on this device; int8=False: the stage does not keep its rankings in int8."""
    if mode not in MODES:
        raise ValueError(f"precision {mode!r} is not one of {MODES}")
    if mode == "fp32":
        return "fp32", "SIEVE_PRECISION=fp32"
    if device.type == "cuda":
        return "fp16", "CUDA"
    if native_bf16():
        return "bf16", "CPU has native bf16 (avx512_bf16 on AMD, amx_bf16 on Intel)"
    if int8 and int8_kernels():
        vnni = "avx512_vnni" in cpu_flags() or "avx_vnni" in cpu_flags()
        return "int8", f"CPU has int8 kernels ({'VNNI' if vnni else 'AVX2'}) but no native bf16"
    return "fp32", "no native bf16 on this device" + ("" if int8 else " (int8 fails the rank guard for this stage)")


class CastFloats(nn.Module):
    """Runs `inner` (weights in `dtype`) on float32 inputs and gives float32 outputs; other attributes of the
    inner module (a head's pair_inputs, parts, ...) stay reachable. With chunked_attention, its attention on a CPU runs
    as chunked bf16/fp16 matmuls (models/attention.py: without AMX torch's fused CPU kernel is no faster in bf16 than
    in fp32)."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype, chunked_attention: bool = True):
        super().__init__()
        self.inner = inner
        self.dtype = dtype
        self.chunked_attention = chunked_attention

    def forward(self, *args, **kwargs):
        cast = lambda x: x.to(self.dtype) if torch.is_tensor(x) and x.is_floating_point() else x  # noqa: E731
        with LowPrecisionAttention() if self.chunked_attention else contextlib.nullcontext():
            out = self.inner(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
        return out.float() if torch.is_tensor(out) and out.is_floating_point() else out

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)


def lowered(module: nn.Module, dtype: str, only: str | None = None,
            chunked_attention: bool | None = None) -> nn.Module:
    """A copy of `module` in `dtype`, or only of its submodule `only` (the rest stays fp32: e.g. CMC's evidence fusion,
    whose scores bf16 would round into ties). int8 quantises the nn.Linear layers; bf16/fp16 cast the weights and wrap
    them in CastFloats (each layer of a ModuleList on its own, so it stays iterable); chunked_attention: bf16/fp16
    attention on a CPU as chunked matmuls (None: where that pays on this CPU, chunked_attention_pays)."""
    if dtype == "fp32":
        return module
    chunked_attention = chunked_attention_pays() if chunked_attention is None else chunked_attention
    out = copy.deepcopy(module)
    target = out.get_submodule(only) if only else out
    if dtype == "int8":
        from torch.ao.quantization import quantize_dynamic

        quantize_dynamic(target, {nn.Linear}, dtype=torch.qint8, inplace=True)
        return out.eval()
    cast = lambda m: CastFloats(m.to(DTYPES[dtype]), DTYPES[dtype], chunked_attention)  # noqa: E731
    if not only:
        return cast(out).eval()
    if isinstance(target, nn.ModuleList):
        for i, layer in enumerate(target):
            target[i] = cast(layer)
    else:
        parent, _, name = only.rpartition(".")
        setattr(out.get_submodule(parent) if parent else out, name, cast(target))
    return out.eval()


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two score vectors (ties broken by position; probes have none in practice)."""
    ra, rb = np.argsort(np.argsort(a)).astype(np.float64), np.argsort(np.argsort(b)).astype(np.float64)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / np.sqrt((ra * ra).sum() * (rb * rb).sum()))


def worst_spearman(reference: np.ndarray, scores: np.ndarray) -> float:
    """Lowest per-row Spearman of (P, N) score matrices."""
    assert reference.shape == scores.shape, f"{reference.shape} != {scores.shape}"
    return min(spearman(r, s) for r, s in zip(np.atleast_2d(reference), np.atleast_2d(scores)))


def lower(module: nn.Module, device: torch.device, mode: str, probe: Probe, only: str | None = None,
          int8: bool = True, chunked_attention: bool | None = None) -> tuple[nn.Module, Choice]:
    """The best dtype for this device if it keeps the probe's rankings, else the fp32 module itself."""
    dtype, reason = best_dtype(device, mode, int8)
    if dtype == "fp32":
        return module, Choice("fp32", reason)
    if only and next(module.get_submodule(only).parameters(), None) is None:
        return module, Choice("fp32", f"nothing to lower (no parameters in {only!r})")
    chunked_attention = chunked_attention_pays() if chunked_attention is None else chunked_attention
    if device.type == "cpu" and dtype in DTYPES:
        reason += "; attention " + ("chunked" if chunked_attention else "in torch's fused kernel")
    return guarded(module, lowered(module, dtype, only, chunked_attention), probe, Choice(dtype, reason),
                   timed=device.type == "cpu")


def guarded(module: nn.Module, candidate: nn.Module, probe: Probe, choice: Choice,
            timed: bool = True) -> tuple[nn.Module, Choice]:
    """`candidate` with `choice` (and its Spearman) if it keeps the probe's rankings and, when `timed` (a CPU), is
    not both MAX_SLOWDOWN x and MIN_EXTRA_S slower than the fp32 module on it; else the fp32 module itself."""
    rho = worst_spearman(probe(module), probe(candidate))  # also the warm-up of both: kernels chosen, JIT done
    if rho < MIN_SPEARMAN:
        return module, Choice("fp32", f"{choice.dtype} ({choice.runtime}) failed the guard "
                                      f"(Spearman {rho:.4f} < {MIN_SPEARMAN})", rho)
    if timed:
        fp32_s = probe_seconds(probe, module)
        lowered_s = probe_seconds(probe, candidate)
        if lowered_s > MAX_SLOWDOWN * fp32_s + MIN_EXTRA_S:  # slow once: is it slow again?
            lowered_s = min(lowered_s, probe_seconds(probe, candidate))
        if lowered_s > MAX_SLOWDOWN * fp32_s and lowered_s > fp32_s + MIN_EXTRA_S:
            return module, Choice("fp32", f"{choice.dtype} ({choice.runtime}) kept the rankings but ran "
                                          f"{lowered_s / fp32_s:.1f}x slower than fp32 on this CPU "
                                          f"({1000 * lowered_s:.1f} against {1000 * fp32_s:.1f} ms)", rho)
    return candidate, replace(choice, spearman=rho)


def probe_seconds(probe: Probe, module: nn.Module) -> float:
    start = time.perf_counter()
    probe(module)
    return time.perf_counter() - start
