"""Prometheus metrics of one app instance (own registry, so several apps in one process do not collide).
deploy/grafana/dashboards/sieve.json and deploy/prometheus/alerts.yml read these names.

Under worker processes (service/workers.py sets PROMETHEUS_MULTIPROC_DIR before a worker starts) counters,
histograms and gauges live in prometheus-client's per-process files and /metrics adds up every worker: counters and
histograms summed, `sieve_inflight_requests` summed over live workers, the index gauges the most recent value a live
worker set, the "up" gauges the lowest of the live workers. What describes the process answering the scrape (the
served CMC, its coverage, the remote cross-encoder's breaker) is read from that worker at scrape time (WorkerView):
every worker serves the same CMC; each has its own breaker.
"""
from __future__ import annotations

import os
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CANDIDATE_BUCKETS = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class WorkerView:
    """Collector of the values read from this process when /metrics is scraped."""

    def __init__(self):
        self.cmc_info: dict[str, str] = {"name": "", "source": "none", "version": ""}
        self.coverage: Callable[[], float] = lambda: 0.0
        self.breaker_open: Callable[[], float] = lambda: 0.0

    def collect(self):
        yield InfoMetricFamily("sieve_cmc", "The served CMC: name, source (setting, adapted, shipped, untrained) and "
                               "adapted version.", value=self.cmc_info)
        yield GaugeMetricFamily("sieve_cmc_adapted_coverage", "Share of the live index's documents the served "
                                "adapted CMC was adapted on (0 when the CMC is not an adapted one).",
                                value=self.coverage())
        yield GaugeMetricFamily("sieve_remote_ce_breaker_open", "1 while the remote cross-encoder's circuit breaker "
                                "is open or half-open, 0 when closed.", value=self.breaker_open())


class Metrics:
    def __init__(self):
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = self.registry = CollectorRegistry()
        self.children: dict[tuple, object] = {}
        self.view = WorkerView()
        r.register(self.view)
        self.stage_latency = Histogram("sieve_stage_latency_seconds", "Latency of each pipeline stage.",
                                       ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.request_latency = Histogram("sieve_request_latency_seconds", "HTTP request latency by endpoint.",
                                         ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("sieve_requests_total", "HTTP requests by endpoint and status code.",
                                ["endpoint", "status"], registry=r)
        self.candidates = Histogram("sieve_stage_candidates", "Candidates entering each stage.",
                                    ["stage"], buckets=CANDIDATE_BUCKETS, registry=r)
        self.batch_size = Histogram("sieve_batch_size", "Requests per forward pass, by model runner.",
                                    ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.partial = Counter("sieve_partial_responses_total", "Responses with a stage skipped for lack of time.",
                               ["endpoint", "skipped"], registry=r)
        self.cache = Counter("sieve_cache_requests_total", "Cache look-ups by cache and outcome (hit, miss).",
                             ["cache", "outcome"], registry=r)
        self.cache_errors = Counter("sieve_cache_errors_total", "Redis calls that failed or timed out (served without).",
                                    ["op"], registry=r)
        self.redis_up = Gauge("sieve_redis_up", "1 when the last Redis call succeeded, 0 when it failed.",
                              multiprocess_mode="livemin", registry=r)
        self.rejected = Counter("sieve_rejected_total", "Requests refused before any work (unauthorized, "
                                "rate_limited, overloaded, too_large).", ["reason"], registry=r)
        self.inflight = Gauge("sieve_inflight_requests", "Requests in progress.", multiprocess_mode="livesum",
                              registry=r)
        self.index_size = Gauge("sieve_index_size", "Documents in the live index.",
                                multiprocess_mode="livemostrecent", registry=r)
        self.index_version = Gauge("sieve_index_version", "Version of the live index.",
                                   multiprocess_mode="livemostrecent", registry=r)
        self.index_writes = Counter("sieve_index_writes_total", "Acknowledged document writes by operation.",
                                    ["op"], registry=r)
        self.index_commit = Histogram("sieve_index_commit_seconds", "Time to write and swap in one index version.",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.gc_pause = Histogram("sieve_gc_pause_seconds", "Python garbage collections of generations 1 and 2 in the "
                                  "served process, by generation: every thread waits while one runs (service/heap.py).",
                                  ["generation"], buckets=GC_PAUSE_BUCKETS, registry=r)
        # calls to SIEVE_CE_URL by outcome, retries, and the circuit breaker
        self.remote_ce_calls = Counter("sieve_remote_ce_calls_total", "Remote cross-encoder calls by outcome (ok, "
                                       "error, timeout, late, rejected, malformed, short_circuited).", ["outcome"], registry=r)
        self.remote_ce_retries = Counter("sieve_remote_ce_retries_total", "Retries of failed remote cross-encoder calls.",
                                         registry=r)
        # a Qdrant index (SIEVE_INDEX_BACKEND=qdrant): its calls by operation and outcome, and whether the last answered
        self.index_backend_calls = Counter("sieve_index_backend_calls_total", "Calls to the Qdrant index by operation "
                                           "and outcome (ok, error).", ["op", "outcome"], registry=r)
        self.index_backend_up = Gauge("sieve_index_backend_up", "1 when the last call to the Qdrant index succeeded, "
                                      "0 when it failed.", multiprocess_mode="livemin", registry=r)
        for reason in ("unauthorized", "rate_limited", "overloaded", "too_large"):
            self.rejected.labels(reason=reason)  # exported at 0 from the start, so rate() has a series

    def observe(self, timings_ms: dict[str, float], counts: dict[str, int]) -> None:
        for stage, ms in timings_ms.items():
            self.child(self.stage_latency, stage).observe(ms / 1000)
        for stage, n in counts.items():
            self.child(self.candidates, stage).observe(n)

    def child(self, metric, *labels: str):
        """metric.labels(*labels), remembered: labels() parses its arguments and takes a lock on every call, and a
        request observes a dozen series."""
        key = (id(metric), labels)
        found = self.children.get(key)
        if found is None:
            found = self.children[key] = metric.labels(*labels)
        return found

    def observe_batch(self, model: str, size: int) -> None:
        self.batch_size.labels(model=model.rsplit(":", 1)[0]).observe(size)  # runner key less the object id

    def watch_remote_ce(self, remote) -> None:
        """Count the client's calls and retries; the breaker gauge is read at scrape time."""
        remote.on_outcome = lambda outcome: self.remote_ce_calls.labels(outcome=outcome).inc()
        remote.on_retry = self.remote_ce_retries.inc
        self.remote_ce_calls.labels(outcome="ok")  # exported at 0 from the start
        self.view.breaker_open = lambda: float(remote.breaker.state != "closed")

    def watch_cmc(self, served) -> None:
        """The served CMC (service/cmc_serving.py): its info now and after each swap, its coverage at scrape time."""
        self.view.cmc_info = served.info()
        self.view.coverage = served.coverage_fraction

    def set_cmc_info(self, info: dict[str, str]) -> None:
        self.view.cmc_info = info

    def observe_index_call(self, op: str, ok: bool) -> None:
        self.index_backend_calls.labels(op=op, outcome="ok" if ok else "error").inc()
        self.index_backend_up.set(1.0 if ok else 0.0)

    def exposition(self) -> bytes:
        """The text /metrics answers: this app's registry, or under workers every worker's files added up plus this
        worker's view."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess

        combined = CollectorRegistry()
        multiprocess.MultiProcessCollector(combined)
        combined.register(self.view)
        return generate_latest(combined)

    def set_index(self, index) -> None:
        self.index_size.set(index.size)
        self.index_version.set(index.version)
