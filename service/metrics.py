"""Prometheus metrics on a registry owned by the app (so several apps can live in one process, e.g. tests)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CANDIDATE_BUCKETS = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.stage_latency = Histogram("sieve_stage_latency_seconds", "Latency of each pipeline stage.",
                                       ["stage"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.requests = Counter("sieve_requests_total", "HTTP requests by endpoint and status code.",
                                ["endpoint", "status"], registry=self.registry)
        self.candidates = Histogram("sieve_stage_candidates", "Candidates entering each stage.",
                                    ["stage"], buckets=CANDIDATE_BUCKETS, registry=self.registry)
        self.index_size = Gauge("sieve_index_size", "Documents in the live index.", registry=self.registry)
        self.index_version = Gauge("sieve_index_version", "Version of the live index.", registry=self.registry)

    def observe(self, timings_ms: dict[str, float], counts: dict[str, int]) -> None:
        for stage, ms in timings_ms.items():
            self.stage_latency.labels(stage=stage).observe(ms / 1000)
        for stage, n in counts.items():
            self.candidates.labels(stage=stage).observe(n)
