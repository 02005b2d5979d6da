"""Serving an index's adapted CMC (`sieve adapt`, sieve/index/adapted.py): the load order SIEVE_CMC_PATH > adapted >
shipped, the fallback when an adapted CMC does not fit the bi-encoder, /readyz's source and coverage, the cache
fingerprint of two adapted versions, and the live swap when a new one is published while the server runs."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sieve import checkpoints
from sieve.index import SearchIndex
from sieve.index.adapted import current_adapted
from sieve.pipeline.searcher import Searcher
from sieve.service.app import create_app, fingerprint
from sieve.service.components import Components
from sieve.service.config import Settings
from sieve.stages.cmc import load_first
from tests.server import Server
from tests.service.adapted_helpers import NAME, publish_adapted

QUERY = {"query": "how do volcanoes erupt", "top_k": 5, "rerank": "cmc"}


def live_ids(index_dir: Path) -> list[str]:
    with SearchIndex.load(index_dir) as index:
        return index.ids(range(index.size))


def test_load_order_is_setting_then_adapted_then_shipped(index_copy, biencoder):
    shipped = checkpoints.shipped(checkpoints.CMC)
    settings = Settings(index_dir=index_copy)
    assert current_adapted(index_copy) is None  # never adapted
    assert settings.cmc_choices(current_adapted(index_copy)) == [("shipped", shipped), ("untrained", None)]
    adapted = publish_adapted(index_copy, biencoder, live_ids(index_copy), seed=1)
    assert current_adapted(index_copy) == adapted
    assert settings.cmc_choices(adapted) == [("adapted", adapted), ("shipped", shipped), ("untrained", None)]
    assert settings.resolved_cmc_path(adapted) == adapted
    assert settings.resolved_cmc_path() == shipped  # without an index (eval's document stores): no adapted CMC
    explicit = Settings(index_dir=index_copy, cmc_path="shipped:cmc")
    assert explicit.cmc_choices(adapted) == [("setting", checkpoints.ROOT / "cmc")]
    assert Settings(index_dir=index_copy, cmc_path="untrained").cmc_choices(adapted) == [("setting", None)]
    with SearchIndex.load(index_copy) as index:
        served = load_first(settings.cmc_choices(adapted), biencoder, index)
        assert (served.path, served.name) == (adapted, NAME)
        assert load_first(explicit.cmc_choices(adapted), biencoder, index).path == checkpoints.ROOT / "cmc"


def test_an_adapted_cmc_for_another_biencoder_is_passed_over_for_the_shipped_one(index_copy, biencoder, caplog):
    adapted = publish_adapted(index_copy, biencoder, live_ids(index_copy), seed=2, base_model_hash="0" * 64)
    settings = Settings(index_dir=index_copy)
    with SearchIndex.load(index_copy) as index, caplog.at_level(logging.WARNING, logger="sieve"):
        served = load_first(settings.cmc_choices(adapted), biencoder, index)
        assert served.path == checkpoints.shipped(checkpoints.CMC)
        assert any(str(adapted) in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
        with pytest.raises(ValueError, match="bi-encoder"):  # named explicitly, it must fit
            load_first(Settings(index_dir=index_copy, cmc_path=adapted).cmc_choices(adapted), biencoder, index)


def test_the_fingerprint_differs_between_two_adapted_versions(index_copy, biencoder):
    ids = live_ids(index_copy)
    first, second = publish_adapted(index_copy, biencoder, ids, seed=3), publish_adapted(index_copy, biencoder, ids, seed=4)
    settings = Settings(index_dir=index_copy)
    with SearchIndex.load(index_copy) as index:
        def of(path: Path) -> str:
            searcher = Searcher(biencoder, index, load_first([("adapted", path)], biencoder, index))
            try:
                return fingerprint(Components(searcher, "cpu"), settings)
            finally:
                searcher.close()

        assert of(first) != of(second)  # one name, other weights
        assert of(first) == of(first)  # stable: replicas with the same adapted CMC share cached results


def ready_cmc(client) -> dict:
    return client.get("/readyz").json()["cmc"]


def scores(answer: dict) -> list[tuple[str, float]]:
    return [(r["id"], round(r["scores"]["cmc"], 4)) for r in answer["results"]]


def test_readyz_coverage_and_a_live_swap_to_a_newly_published_adapted_cmc(index_copy, biencoder, tmp_path):
    ids = live_ids(index_copy)
    half = ids[: len(ids) // 2]
    first = publish_adapted(index_copy, biencoder, half, seed=5)
    server = Server({"SIEVE_INDEX_DIR": str(index_copy), "SIEVE_CMC_PATH": ""}, tmp_path / "server.log")
    try:
        with server.client() as client:
            cmc = ready_cmc(client)
            # no file paths without an API key (issue 34): the version names the adapted CMC
            assert (cmc["name"], cmc["source"], cmc["path"]) == (NAME, "adapted", None)
            assert cmc["adapted"] == {"version": first.name, "documents": len(half), "live_documents": len(ids),
                                      "covered": len(half), "coverage": len(half) / len(ids),
                                      "created": "2026-11-25T09:05:00Z"}
            assert client.post("/documents", json={"documents": [{"id": "new-1", "text": "a fresh note"}]}).status_code == 200
            after_write = ready_cmc(client)["adapted"]
            assert (after_write["live_documents"], after_write["covered"]) == (len(ids) + 1, len(half))
            assert after_write["coverage"] == len(half) / (len(ids) + 1)

            old = client.post("/search", json=QUERY).json()
            assert client.post("/search", json=QUERY).json()["cached"]  # the result cache is on
            second = publish_adapted(index_copy, biencoder, ids, seed=6)
            reloaded = client.post("/admin/index/reload").json()
            assert reloaded["cmc_changed"] and not reloaded["changed"]
            cmc = ready_cmc(client)
            assert (cmc["name"], cmc["adapted"]["version"]) == (NAME, second.name)
            assert cmc["adapted"]["covered"] == len(ids) and cmc["adapted"]["live_documents"] == len(ids) + 1
            new = client.post("/search", json=QUERY).json()
            assert not new["cached"], "a result of the old CMC was served from the cache"
            assert scores(new) != scores(old)
            fresh = client.post("/search", json=QUERY, headers={"Cache-Control": "no-cache"}).json()
            # the new model's answer: the same ids, scores equal up to float32 rounding (the fresh query vector is
            # encoded again, alone; on a host whose kernels depend on the batch's shape (oneDNN with AMX) the two
            # encodings may differ in their last bits: 91.7419 against 91.7418 seen)
            assert [i for i, _ in scores(new)] == [i for i, _ in scores(fresh)]
            assert [s for _, s in scores(new)] == pytest.approx([s for _, s in scores(fresh)], rel=1e-5, abs=1e-3)
            assert not client.post("/admin/index/reload").json()["cmc_changed"]  # nothing new: no second swap
            metrics = client.get("/metrics").text
            assert f'sieve_cmc_info{{name="{NAME}",source="adapted",version="{second.name}"}} 1.0' in metrics
            assert f"sieve_cmc_adapted_coverage {len(ids) / (len(ids) + 1)}" in metrics
    finally:
        server.stop()


def test_the_poll_swaps_in_a_new_adapted_cmc_and_a_setting_is_never_replaced(index_copy, biencoder):
    ids = live_ids(index_copy)
    polled = Settings(index_dir=index_copy, index_poll_s=0.05, cmc_path=None)
    pinned = Settings(index_dir=index_copy, index_poll_s=0.05, cmc_path="shipped:cmc-fusion")
    with TestClient(create_app(polled)) as client, TestClient(create_app(pinned)) as pinned_client:
        assert ready_cmc(client)["source"] == "shipped"  # the index was never adapted
        published = publish_adapted(index_copy, biencoder, ids, seed=7)
        deadline = time.monotonic() + 120  # the poll interval plus a wide margin for a loaded 2-core machine
        while (ready_cmc(client)["adapted"] or {}).get("version") != published.name and time.monotonic() < deadline:
            time.sleep(0.05)
        cmc = ready_cmc(client)
        assert (cmc["source"], cmc["adapted"]["coverage"]) == ("adapted", 1.0)
        assert not pinned_client.post("/admin/index/reload").json()["cmc_changed"]
        assert ready_cmc(pinned_client)["source"] == "setting"


def test_sieve_eval_over_an_adapted_index_evaluates_its_adapted_cmc(index_copy, biencoder):
    from sieve.evaluation.local import load_local
    from tests.conftest import DEMO_CORPUS

    adapted = publish_adapted(index_copy, biencoder, live_ids(index_copy), seed=8)
    components = load_local(Settings(), "demo", DEMO_CORPUS, index_dir=index_copy)
    try:
        assert components.searcher.cmc.path == adapted
    finally:
        components.close()
