"""Device choice and how forwards run there (streams, CUDA graphs), made once at start-up by the caller (never
inside model code)."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch


def pick_device(preference: str = "auto") -> torch.device:
    """'auto' -> CUDA when present, else CPU; 'cpu' / 'cuda' / 'cuda:N' are taken as given."""
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(preference)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {preference!r} was asked for but CUDA is not available; use 'auto' or 'cpu'")
    return device


@dataclass(frozen=True)
class DeviceRuntime:
    """How a model's forwards run on its device, chosen once at start-up (service/components.py): bucketed shapes
    (models/buckets.py), a CUDA stream per calling thread, CUDA graphs (torch.compile 'reduce-overhead')."""

    buckets: bool = False
    streams: bool = False
    graphs: bool = False


_streams = threading.local()  # one CUDA stream per thread and device: each batcher thread (one per model) its own


@contextmanager
def own_stream(device: torch.device, enabled: bool) -> Iterator[None]:
    """On CUDA (when enabled), run the block on this thread's own stream and wait for it at the end, so the
    tensors it returns are ready for any other thread; anywhere else a no-op. The readers of those tensors (the
    first stage, CMC's padding) copy them to the host with blocking copies, so no kernel of another stream is still
    reading one when its memory goes back to this stream's pool."""
    if not enabled or device.type != "cuda":
        yield
        return
    streams = _streams.__dict__.setdefault("by_device", {})
    stream = streams.get(device)
    if stream is None:
        stream = streams[device] = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))  # inputs made on the default stream are ready
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()


def graphed(module: torch.nn.Module, device: torch.device, enabled: bool) -> torch.nn.Module:
    """`module` compiled for CUDA graphs (torch.compile mode='reduce-overhead', one graph per bucketed shape) on
    CUDA when enabled; the module itself anywhere else. Outputs of a graphed module are overwritten by its next
    replay: callers clone them (run_graphed)."""
    if not enabled or device.type != "cuda":
        return module
    return torch.compile(module, mode="reduce-overhead", dynamic=True)


def run_graphed(module, graphs: bool, *args, **kwargs) -> torch.Tensor:
    """module(*args, **kwargs); with CUDA graphs a new graph step is marked first and the output cloned out of the
    graph's memory, which the next replay reuses."""
    if not graphs:
        return module(*args, **kwargs)
    torch.compiler.cudagraph_mark_step_begin()
    return module(*args, **kwargs).clone()
