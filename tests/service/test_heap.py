"""The served process freezes its start-up heap out of the garbage collector (service/heap.py); a test's app does not."""
from __future__ import annotations

import gc
import re

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
    with TestClient(create_app(settings, loader=loader)) as client:
        assert client.get("/readyz").status_code == 200
    assert gc.get_freeze_count() == before == 0
