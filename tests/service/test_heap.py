"""The served process freezes its start-up heap out of the garbage collector (service/heap.py); a test's app does not."""
from __future__ import annotations

import gc
import re
import time

from fastapi.testclient import TestClient

from sieve.service.app import create_app
from sieve.service.config import Settings
from tests.service.test_fast_search import fake_components  # noqa: F401 - the module's fixture, reused

FROZE = re.compile(r"froze (\d+) start-up objects")


def frozen_counts(log_text: str) -> list[int]:
    return [int(n) for n in FROZE.findall(log_text)]


def test_the_served_process_froze_its_start_up_objects(guarded_server):
    """`sieve serve`'s single process (run_server): one freeze, after the models and the index were loaded."""
    guarded_server.wait_ready(120)
    counts = frozen_counts(guarded_server.log_path.read_text())
    assert len(counts) == 1, counts
    assert counts[0] > 50_000  # the models, tokenizers and libraries: ~460,000 objects on a SciFact index


def test_an_app_made_in_a_test_process_freezes_nothing(fake_components):  # noqa: F811
    """Frozen objects are never collected: a test process that makes and drops many apps must not freeze."""
    index_dir, loader = fake_components
    before = gc.get_freeze_count()
    settings = Settings(_env_file=None, index_dir=index_dir, model_name="tiny-bert", write_batch_wait_ms=0)
    callbacks = list(gc.callbacks)
    with TestClient(create_app(settings, loader=loader)) as client:
        assert client.get("/readyz").status_code == 200
        assert gc.callbacks == callbacks  # no pause clock either
    assert gc.get_freeze_count() == before == 0


def gc_pause_count(metrics_text: str, generation: int) -> float:
    found = re.search(rf'^sieve_gc_pause_seconds_count{{generation="{generation}"}} (\S+)$', metrics_text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


def test_the_served_process_times_its_full_collections(guarded_server):
    """The start-up collection before the freeze is the first generation-2 pause /metrics counts; both series
    exist from the start (a dashboard panel reads them)."""
    guarded_server.wait_ready(120)
    deadline = time.monotonic() + 30
    with guarded_server.client() as client:
        while True:
            text = client.get("/metrics").text
            if gc_pause_count(text, 2) >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # the clock's thread feeds the histogram once a second
    assert gc_pause_count(text, 2) >= 1 and gc_pause_count(text, 1) >= 0, text[-2000:]


def test_a_pause_clock_times_collections_and_lets_go_of_the_collector():
    from prometheus_client import CollectorRegistry, Histogram

    from sieve.service.heap import PauseClock

    histogram = Histogram("pauses", "test", ["generation"], registry=CollectorRegistry())
    clock = PauseClock(histogram, flush_s=60).start()
    try:
        gc.collect(1)
        gc.collect(2)
        gc.collect(0)  # not timed
    finally:
        clock.stop()  # flushes what is pending
    assert clock not in gc.callbacks
    counts = {s.labels["generation"]: s.value for s in histogram.collect()[0].samples if s.name == "pauses_count"}
    assert counts == {"1": 1.0, "2": 1.0}
