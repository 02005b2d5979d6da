"""An adapted CMC belongs to the Qdrant collection it was made for (issue 35): a Qdrant-backed server serves the one
kept in its collection (index/adapted_qdrant.py) and never the adapted CMC of an unrelated SIEVE_INDEX_DIR; /readyz
and the start-up log name the collection; a CMC published while the server runs is swapped in on reload and on the
poll. `sieve adapt` on a collection: tests/training/test_adapt_qdrant.py."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from fastapi.testclient import TestClient

from sieve.index import read_beir_corpus
from sieve.index.adapted import current_adapted
from sieve.index.adapted_qdrant import QdrantAdapted
from sieve.index.qdrant_backend import QdrantConfig, QdrantIndex
from sieve.service.app import create_app
from sieve.service.config import Settings
from tests.conftest import DEMO_CORPUS
from tests.server import Server
from tests.service.adapted_helpers import NAME, build_collection, publish_adapted, sha256

EDGE = "qdrant-edge"


KEY = "adapted-test-key"  # /readyz shows file paths only to a caller with a valid key (issue 34)


def ready(client) -> dict:
    answer = client.get("/readyz", headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_qdrant_backed_server_serves_only_the_adapted_cmc_of_its_collection(tmp_path, biencoder, cache_dir,
                                                                              index_copy):
    """The server is pointed at an unrelated local index (SIEVE_INDEX_DIR) that has an adapted CMC of its own."""
    local_adapted = publish_adapted(index_copy, biencoder, ["astro-1"], seed=11)
    ids = [d.id for d in read_beir_corpus(DEMO_CORPUS)]
    build_collection(tmp_path / "edge", biencoder, cache_dir)
    owner = QdrantIndex(QdrantConfig(str(tmp_path / "edge"), "demo", engine="edge"))
    try:
        published = publish_adapted(QdrantAdapted(owner, tmp_path / "publisher" / "adapted"), biencoder, ids, seed=12)
    finally:
        owner.close()
    env = {"SIEVE_INDEX_BACKEND": EDGE, "SIEVE_QDRANT_EDGE_PATH": str(tmp_path / "edge"),
           "SIEVE_QDRANT_COLLECTION": "demo", "SIEVE_INDEX_DIR": str(index_copy), "SIEVE_CMC_PATH": "",
           "SIEVE_CACHE_DIR": str(tmp_path / "server-cache"), "SIEVE_API_KEYS": KEY}
    server = Server(env, tmp_path / "server.log")
    try:
        with server.client() as client:
            status = ready(client)
            assert (status["index_backend"], status["index_dir"], status["collection"]) == \
                (EDGE, str(tmp_path / "edge"), "demo")
            cmc = status["cmc"]
            assert (cmc["name"], cmc["source"], cmc["adapted"]["version"]) == (NAME, "adapted", published.name)
            assert Path(cmc["path"]).is_relative_to(tmp_path / "server-cache")  # its own copy, fetched from Qdrant
            assert sha256(Path(cmc["path"]) / "cmc.safetensors") == sha256(published / "cmc.safetensors")
            assert sha256(Path(cmc["path"]) / "cmc.safetensors") != sha256(local_adapted / "cmc.safetensors")
            assert cmc["adapted"]["covered"] == cmc["adapted"]["live_documents"] == 60
            answer = client.post("/search", json={"query": "how do volcanoes erupt", "rerank": "cmc"},
                                 headers={"Authorization": f"Bearer {KEY}"})
            assert answer.status_code == 200 and "cmc" in answer.json()["results"][0]["scores"]
    finally:
        server.stop()
    log = (tmp_path / "server.log").read_text()
    assert f"loaded {EDGE} collection 'demo' at {tmp_path / 'edge'}" in log and str(index_copy) not in log
    assert current_adapted(index_copy) == local_adapted  # the local index's own model, untouched and unserved


def test_a_collection_never_adapted_serves_the_shipped_cmc_and_swaps_in_one_published_later(
        tmp_path, biencoder, cache_dir, index_copy, caplog):
    publish_adapted(index_copy, biencoder, ["astro-1"], seed=13)  # the unrelated SIEVE_INDEX_DIR has one
    build_collection(tmp_path / "edge", biencoder, cache_dir)
    settings = Settings(index_backend=EDGE, qdrant_edge_path=tmp_path / "edge", qdrant_collection="demo",
                        index_dir=index_copy, cmc_path=None, cache_dir=tmp_path / "cache", api_keys=KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    ids = [d.id for d in read_beir_corpus(DEMO_CORPUS)]
    with caplog.at_level(logging.INFO, logger="sieve"), TestClient(create_app(settings), headers=auth) as client:
        assert ready(client)["cmc"]["source"] == "shipped"
        assert any(f"loaded {EDGE} collection 'demo'" in r.getMessage() for r in caplog.records)
        # the server holds the edge shards: publish through its own index, as a trainer inside it would
        store = QdrantAdapted(client.app.state.components.searcher.index, tmp_path / "trainer" / "adapted")
        first = publish_adapted(store, biencoder, ids, seed=14)
        assert ready(client)["cmc"]["source"] == "shipped"  # no poll: swapped on reload only
        reloaded = client.post("/admin/index/reload").json()
        assert reloaded["cmc_changed"] and not reloaded["changed"]
        cmc = ready(client)["cmc"]
        assert (cmc["source"], cmc["adapted"]["version"]) == ("adapted", first.name)
        assert not client.post("/admin/index/reload").json()["cmc_changed"]
    with TestClient(create_app(settings.model_copy(update={"index_poll_s": 0.05})), headers=auth) as client:
        assert ready(client)["cmc"]["adapted"]["version"] == first.name  # a server started later loads it
        store = QdrantAdapted(client.app.state.components.searcher.index, tmp_path / "trainer" / "adapted")
        second = publish_adapted(store, biencoder, ids, seed=15)
        deadline = time.monotonic() + 120  # the poll interval plus a wide margin for a loaded 2-core machine
        while ready(client)["cmc"]["adapted"]["version"] != second.name and time.monotonic() < deadline:
            time.sleep(0.05)
        cmc = ready(client)["cmc"]
        assert (cmc["adapted"]["version"], cmc["adapted"]["coverage"]) == (second.name, 1.0)
        assert Path(cmc["path"]).is_relative_to(tmp_path / "cache")
