"""Per-request state handed from stage to stage."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from pipeline.candidates import Candidates


@dataclass
class QueryState:
    query: str
    candidates: Candidates | None = None
    query_vectors: dict[str, torch.Tensor] = field(default_factory=dict)  # "be", "cmc" -> (d,)
    timings_ms: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # candidates that entered each stage
    warnings: list[str] = field(default_factory=list)

    @contextmanager
    def timed(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings_ms[stage] = self.timings_ms.get(stage, 0.0) + (time.perf_counter() - start) * 1000
