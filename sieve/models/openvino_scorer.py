"""A cross-encoder pair scorer compiled by OpenVINO for a CPU (bf16 where the CPU has it, else fp32).

Why: on a CPU with AVX-512 BF16 torch's eager bf16 path leaves much of the matmul peak unused between small kernels
(GELU, layer norm, softmax, casts); OpenVINO's CPU plugin fuses them and runs the same Hugging Face checkpoint
1.4x faster per pair at 32 pairs x 256 tokens (docs/performance.md). The model is traced once from the fp32 torch
module (`openvino.convert_model`, input shapes left dynamic, so one compiled model serves every batch and pair
length) and compiled with an inference precision; the caller guards its rankings like any lowered module
(models/precision.py) and keeps the torch scorer when OpenVINO is missing, fails or moves rankings.

Any head whose forward traces is compiled (the plain one-logit "cls" head and "gated" are tested); its other methods
(a pair layout, marker tokens, parts) stay reachable on the fp32 torch module it was traced from.
"""
from __future__ import annotations

import contextlib
import importlib.util
import queue
import threading
import warnings
from typing import Mapping

import numpy as np
import torch
from torch import nn

PRECISION_HINTS = {"bf16": "bf16", "fp32": "f32"}


def available() -> bool:
    return importlib.util.find_spec("openvino") is not None


def version() -> str:
    import openvino

    return openvino.__version__.split("-")[0]


class OpenVINOScorer(nn.Module):
    """PairScorer's call, forward(input_ids, attention_mask, token_type_ids=None) -> (B,) float32, run by a compiled
    OpenVINO model. Infer requests are not thread-safe and each holds its own activation memory (~100 MB for 32
    MiniLM pairs of 256 tokens), so callers share a pool of at most `max_requests`, made on demand: more concurrent
    forwards than that wait (the cores are busy anyway), and memory stays bounded however many threads call."""

    def __init__(self, compiled, input_names: tuple[str, ...], dtype: str, traced: nn.Module, max_requests: int = 2):
        super().__init__()
        self.traced = traced
        self.compiled = compiled
        self.input_names = input_names
        self.dtype = dtype
        self.slots = threading.BoundedSemaphore(max_requests)
        self.idle: queue.SimpleQueue = queue.SimpleQueue()
        self.created = 0

    @contextlib.contextmanager
    def request(self):
        with self.slots:
            try:
                req = self.idle.get_nowait()
            except queue.Empty:
                req, self.created = self.compiled.create_infer_request(), self.created + 1
            try:
                yield req
            finally:
                self.idle.put(req)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("traced"), name)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        inputs = {name: given[name].cpu().numpy() for name in self.input_names}
        with self.request() as req:
            out = req.infer(inputs)[0]  # (B, 1) or (B,)
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32).reshape(len(input_ids)))


@contextlib.contextmanager
def quiet_transformers():
    """transformers' own log at errors only, for the duration (its warnings here are about training, not serving)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def compile_scorer(scorer: nn.Module, example: Mapping[str, torch.Tensor], dtype: str) -> OpenVINOScorer:
    """Trace the fp32 `scorer` on `example` (its keyword inputs: what CrossEncoder.tokenize_pairs gives) and compile
    it for the CPU in `dtype` ("bf16" or "fp32") on torch's thread count. Raises whatever OpenVINO raises when the model does not convert."""
    import openvino as ov

    if dtype not in PRECISION_HINTS:
        raise ValueError(f"OpenVINO scorer: dtype {dtype!r} is not one of {tuple(PRECISION_HINTS)}")
    names = tuple(k for k in ("input_ids", "attention_mask", "token_type_ids") if k in example)
    with torch.no_grad(), warnings.catch_warnings(), quiet_transformers():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the trace is of fixed code paths, shapes stay dynamic
        # the tracer reads every attribute of every submodule: transformers' deprecated properties and the loss
        # it would pick for training (`loss_type=None ... unrecognized`) then warn at every start, about nothing
        warnings.simplefilter("ignore", FutureWarning)
        model = ov.convert_model(scorer.eval(), example_input={k: example[k].cpu() for k in names})
    config = {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[dtype], "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_NUM_THREADS": torch.get_num_threads()}
    return OpenVINOScorer(ov.Core().compile_model(model, "CPU", config), names, dtype, scorer).eval()
