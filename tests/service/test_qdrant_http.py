"""The HTTP API on a Qdrant collection (SIEVE_INDEX_BACKEND=qdrant; the client's local mode on disk, a real
`sieve serve` process): the same answers as the local index, writes read by the next request and never hidden by
the result cache, bad input, and an unreachable Qdrant (503 index_unavailable, /readyz not ready, the metric)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sieve.index import read_beir_corpus
from sieve.index.qdrant_backend import QdrantConfig
from sieve.index.qdrant_build import build_qdrant
from tests.conftest import DEMO_CORPUS
from tests.server import Server


@pytest.fixture(scope="module")
def qdrant_server(biencoder, cache_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("qdrant-http") / "qdrant"
    build_qdrant(read_beir_corpus(DEMO_CORPUS), {"primary": biencoder}, QdrantConfig(str(path), "demo"),
                 cache_dir=cache_dir, progress=False).close()  # local mode: one process holds the folder at a time
    srv = Server({"SIEVE_INDEX_BACKEND": "qdrant", "SIEVE_QDRANT_URL": str(path), "SIEVE_QDRANT_COLLECTION": "demo"},
                 tmp_path_factory.mktemp("logs") / "qdrant-server.log")
    yield srv
    srv.stop()


@pytest.fixture
def qclient(qdrant_server):
    with qdrant_server.client() as c:
        yield c


@pytest.mark.parametrize("retriever", ["be", "bm25", "hybrid"])
def test_search_answers_as_the_local_index_does(qclient, client, retriever):
    body = {"query": "how do volcanoes erupt", "top_k": 5, "retriever": retriever, "return_documents": True}
    local, qdrant = client.post("/search", json=body), qclient.post("/search", json=body)
    assert qdrant.status_code == 200, qdrant.text
    local, qdrant = local.json(), qdrant.json()
    assert [h["id"] for h in qdrant["results"]] == [h["id"] for h in local["results"]]
    assert [h["document"] for h in qdrant["results"]] == [h["document"] for h in local["results"]]
    for want, got in zip(local["results"], qdrant["results"]):
        assert want["scores"].keys() == got["scores"].keys()
        assert got["score"] == pytest.approx(want["score"], rel=1e-4, abs=1e-4)


def test_readyz_and_rerank_by_id(qclient):
    ready = qclient.get("/readyz")
    assert ready.status_code == 200 and ready.json()["index_size"] >= 60
    ranked = qclient.post("/rerank", json={"query": "volcano eruption", "documents": [
        {"id": "cook-1"}, {"id": "volcano-1"}, {"text": "Lava flows downhill."}]})
    assert ranked.status_code == 200, ranked.text
    assert ranked.json()["results"][0]["index"] in (1, 2)  # the volcano texts before the cooking one


def test_a_write_is_read_by_the_next_search_and_never_hidden_by_the_cache(qclient):
    query = {"query": "saffron crocus harvest", "top_k": 3, "retriever": "hybrid"}
    first = qclient.post("/search", json=query).json()
    assert qclient.post("/search", json=query).json()["cached"]  # the result cache is on
    doc = {"id": "saffron-1", "title": "Saffron", "text": "Saffron is harvested by hand from crocus flowers."}
    added = qclient.post("/documents", json={"documents": [doc]})
    assert added.status_code == 200, added.text
    assert added.json()["upserted"] == 1 and added.json()["index_version"] > first["index_version"]
    after = qclient.post("/search", json=query).json()
    assert not after["cached"] and after["results"][0]["id"] == "saffron-1"
    assert after["index_version"] == added.json()["index_version"]
    assert qclient.get("/documents/saffron-1").json()["text"] == doc["text"]
    gone = qclient.delete("/documents/saffron-1")
    assert gone.status_code == 200 and gone.json()["deleted"] == ["saffron-1"]
    assert "saffron-1" not in [h["id"] for h in qclient.post("/search", json=query).json()["results"]]
    assert qclient.get("/documents/saffron-1").status_code == 404
    assert qclient.delete("/documents/saffron-1").status_code == 404


def test_bad_input_is_refused_as_on_the_local_index(qclient):
    doc = {"id": "dup", "text": "x"}
    assert qclient.post("/documents", json={"documents": [doc, doc]}).status_code == 422
    unknown = qclient.post("/search", json={"query": "x", "retriever": "nope"})
    assert unknown.status_code == 422 and "hybrid" in unknown.json()["error"]["allowed"]
    assert qclient.post("/rerank", json={"query": "x", "documents": [{"id": "no-such-doc"}]}).status_code == 422


@pytest.fixture(scope="module")
def unreachable():
    """A server whose Qdrant does not answer (nothing listens on port 1): it starts, and is not ready."""
    from sieve.service.app import create_app
    from sieve.service.config import Settings

    settings = Settings(index_backend="qdrant", qdrant_url="http://127.0.0.1:1", qdrant_timeout_ms=500,
                        cmc_path="untrained", cross_encoder_enabled=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def test_qdrant_unreachable_answers_503_and_is_not_ready(unreachable):
    ready = unreachable.get("/readyz")
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "index_unavailable"
    for response in (unreachable.post("/search", json={"query": "volcano"}),
                     unreachable.post("/search", json={"query": "volcano", "retriever": "be", "rerank": "none"}),
                     unreachable.post("/documents", json={"documents": [{"id": "a", "text": "b"}]}),
                     unreachable.delete("/documents/a"), unreachable.get("/documents/a")):
        assert response.status_code == 503, response.text
        body = response.json()["error"]
        assert body["code"] == "index_unavailable" and "127.0.0.1:1" in body["message"]
        assert response.headers["retry-after"] == "1"
    metrics = unreachable.get("/metrics").text
    assert "sieve_index_backend_up 0.0" in metrics
    assert 'sieve_index_backend_calls_total{op="meta",outcome="error"}' in metrics
