"""Qdrant faults through the HTTP API, on both engines that run here (the client's local mode on a directory and
qdrant-edge), with real stores and no stand-ins:

- a store another process holds (local mode locks its folder, edge its shard's WAL) cannot be opened: a real
  `sieve serve` process answers 503 and is not ready; once the holder lets go, the same process answers, no restart;
- a write Qdrant refuses (the collection recreated behind the service's back without the BM25 vector) answers 503,
  and nothing of it is readable or searchable afterwards;
- a collection built by another model, found after start-up, answers 503 index_mismatch at /readyz and elsewhere.
"""
from __future__ import annotations

import time

import httpx
import pytest
from fastapi.testclient import TestClient

from sieve.index import read_beir_corpus
from sieve.index.qdrant_backend import QdrantConfig, point_id
from sieve.index.qdrant_build import build_qdrant
from sieve.index.qdrant_engine import DENSE, Layout, NewPoint
from tests.conftest import DEMO_CORPUS
from tests.index.conftest import FakeEncoder, make_docs
from tests.server import Server

ENGINES = {"client": "qdrant", "edge": "qdrant-edge"}  # QdrantConfig.engine -> SIEVE_INDEX_BACKEND


def served_at(engine: str, path, collection: str) -> dict[str, str]:
    where = {"SIEVE_QDRANT_URL": str(path)} if engine == "client" else {"SIEVE_QDRANT_EDGE_PATH": str(path)}
    return {"SIEVE_INDEX_BACKEND": ENGINES[engine], "SIEVE_QDRANT_COLLECTION": collection, **where}


def in_process(env: dict[str, str]) -> TestClient:
    from sieve.service.app import create_app
    from sieve.service.config import Settings

    fields = {k.removeprefix("SIEVE_").lower(): v for k, v in env.items()}
    settings = Settings(**fields, cmc_path="untrained", cross_encoder_enabled=False, qdrant_reopen_ms=50)
    return TestClient(create_app(settings), raise_server_exceptions=False)


def ready_within(client: httpx.Client, seconds: float) -> httpx.Response:
    """Polls /readyz until it answers 200 or the deadline passes; the last answer."""
    deadline = time.monotonic() + seconds
    while True:
        answer = client.get("/readyz")
        if answer.status_code == 200 or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


@pytest.mark.parametrize("engine", ["client", "edge"])
def test_the_service_recovers_by_itself_when_the_store_is_let_go(engine, biencoder, cache_dir, tmp_path):
    path = tmp_path / "store"
    holder = build_qdrant(read_beir_corpus(DEMO_CORPUS), {"primary": biencoder},
                          QdrantConfig(str(path), "demo", engine=engine), cache_dir=cache_dir, progress=False)
    server = Server({**served_at(engine, path, "demo"), "SIEVE_QDRANT_REOPEN_MS": "100"}, tmp_path / "server.log",
                    until="/healthz")  # this process holds the store: the server starts but cannot open it
    try:
        with server.client(timeout=30) as client:
            body = {"query": "how do volcanoes erupt", "top_k": 3, "retriever": "hybrid"}
            for answer in (client.get("/readyz"), client.post("/search", json=body)):
                assert answer.status_code == 503, answer.text
                error = answer.json()["error"]
                assert error["code"] == "index_unavailable" and "could not be opened" in error["message"]
            holder.close()  # let go: the next request after SIEVE_QDRANT_REOPEN_MS opens it
            ready = ready_within(client, 30)
            assert ready.status_code == 200, ready.text
            assert ready.json()["index_size"] == 60
            found = client.post("/search", json=body)
            assert found.status_code == 200 and found.json()["results"][0]["id"].startswith("volcano")
            assert server.proc.poll() is None  # the same process throughout
    finally:
        holder.close()
        server.stop()


def without_bm25(index, docs) -> None:
    """Recreates the collection behind the service's back, with the same documents but no BM25 vector."""
    held = index.engine.retrieve(index.name, [point_id(d.id) for d in docs], True, [DENSE])
    index.engine.drop(index.name)
    index.engine.create(index.name, {DENSE: len(held[0].vector[DENSE])}, None, Layout())
    index.engine.upsert(index.name, [NewPoint(p.id, {DENSE: p.vector[DENSE]}, p.payload) for p in held])


@pytest.mark.parametrize("engine", ["client", "edge"])
def test_a_write_qdrant_refuses_answers_503_and_stores_nothing(engine, biencoder, cache_dir, tmp_path):
    docs = read_beir_corpus(DEMO_CORPUS)
    build_qdrant(docs, {"primary": biencoder}, QdrantConfig(str(tmp_path / "q"), "demo", engine=engine),
                 cache_dir=cache_dir, progress=False).close()
    with in_process(served_at(engine, tmp_path / "q", "demo")) as client:
        version = client.get("/readyz").json()["index_version"]
        without_bm25(client.app.state.components.searcher.index, docs)
        doc = {"id": "saffron-1", "title": "Saffron", "text": "Saffron is harvested by hand from crocus flowers."}
        refused = client.post("/documents", json={"documents": [doc]})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "index_unavailable" and "upsert" in refused.json()["error"]["message"]
        assert client.get("/documents/saffron-1").status_code == 404
        assert client.get(f"/documents/{docs[0].id}").json()["text"] == docs[0].text  # reads still answer
        found = client.post("/search", json={"query": "saffron crocus flowers harvest", "top_k": 60,
                                             "retriever": "be", "rerank": "none"})
        assert found.status_code == 200, found.text
        ids = [hit["id"] for hit in found.json()["results"]]
        assert len(ids) == 60 and "saffron-1" not in ids
        assert client.get("/readyz").json()["index_version"] == version  # no write was acknowledged


def test_a_collection_of_another_model_answers_503_index_mismatch(tmp_path):
    with in_process(served_at("edge", tmp_path / "edge", "late")) as client:
        before = client.get("/readyz")  # nothing built yet
        assert before.status_code == 503 and before.json()["error"]["code"] == "index_unavailable"
        build_qdrant(make_docs(5), {"primary": FakeEncoder()},
                     QdrantConfig(str(tmp_path / "edge"), "late", engine="edge"), progress=False).close()
        answers = {"readyz": client.get("/readyz"), "search": client.post("/search", json={"query": "w1"}),
                   "write": client.post("/documents", json={"documents": [{"id": "x", "text": "w1"}]})}
        for name, answer in answers.items():
            assert answer.status_code == 503, (name, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "index_mismatch" and "fake-bow" in error["message"], (name, error)
            assert "rebuild" in error["message"]
