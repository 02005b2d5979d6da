"""The Qdrant backend's writes and faults on both engines it runs on here, the client's local mode and qdrant-edge
(each a real Qdrant engine in process, on disk): writes are visible to the next read, a write Qdrant refuses
acknowledges nothing, an unreachable server is a clear IndexUnavailableError, a collection built by another model is
refused, BM25 follows writes, and edge scores as local mode does after writes and deletes."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.index import Document, IndexMismatchError, UnknownDocumentError
from sieve.index.errors import IndexUnavailableError
from sieve.index.qdrant_backend import QdrantConfig, QdrantIndex, point_id
from sieve.index.qdrant_build import build_qdrant
from tests.index.conftest import FakeEncoder, make_docs


@pytest.fixture(params=["client", "edge"])
def built(request, tmp_path):
    encoder = FakeEncoder()
    config = QdrantConfig(str(tmp_path / "qdrant"), "t", engine=request.param)
    index = build_qdrant(make_docs(40), {"primary": encoder}, config, progress=False)
    yield index, encoder
    index.close()


def vectors_of(encoder, docs):
    return {"primary": encoder.encode_documents([d.full_text for d in docs])}


def test_an_upsert_is_read_by_the_next_search_and_moves_the_identity(built):
    index, encoder = built
    before, version, size = index.identity(), index.version, index.size
    doc = Document("new-1", "Saffron", "saffron crocus stigmas harvested by hand")
    index.upsert([doc], vectors_of(encoder, [doc]))
    assert (index.version, index.size) == (version + 1, size + 1)
    assert index.identity() != before
    assert index.lexical_hits("saffron crocus", 5).ids[0] == "new-1"
    assert index.dense_hits(vectors_of(encoder, [doc])["primary"][0], 1).ids == ["new-1"]
    replaced = Document("new-1", "Saffron", "the most expensive spice by weight")
    index.upsert([replaced], vectors_of(encoder, [replaced]))
    assert index.size == size + 1  # same id: replaced, not added
    assert index.documents(index.rows_for_ids(["new-1"])) == [replaced]
    assert index.lexical_hits("crocus stigmas", 5).ids == []  # the old text's terms went with it


def test_a_delete_is_gone_from_every_read(built):
    index, encoder = built
    victim = make_docs(40)[3]
    index.delete([victim.id])
    assert not index.has_id(victim.id)
    assert victim.id not in index.dense_hits(vectors_of(encoder, [victim])["primary"][0], 40).ids
    with pytest.raises(UnknownDocumentError):
        index.documents([point_id(victim.id)])
    version = index.version
    with pytest.raises(UnknownDocumentError):
        index.delete(["never-there"])
    assert index.version == version  # nothing happened, nothing acknowledged


def test_a_write_qdrant_refuses_acknowledges_nothing(built):
    index, encoder = built
    version, generation = index.version, index.identity()
    index.engine.drop(index.name)  # the collection disappears under the service
    doc = Document("lost-1", "", "refused")
    with pytest.raises(IndexUnavailableError, match="failed on upsert"):
        index.upsert([doc], vectors_of(encoder, [doc]))
    assert index.load_meta(force=True)["version"] == version and index.identity() == generation
    with pytest.raises(IndexUnavailableError):
        index.dense_hits(np.ones(encoder.dim, np.float32), 3)


def test_wrong_vectors_are_refused_before_qdrant(built):
    index, _ = built
    with pytest.raises(ValueError, match="needs vectors for"):
        index.upsert([Document("x", "", "y")], {"primary": np.zeros((1, 32), np.float32), "cmc": np.zeros((1, 8))})


def test_an_unreachable_server_is_index_unavailable():
    index = QdrantIndex(QdrantConfig("http://127.0.0.1:1", "t", timeout_s=1))
    for call in (index.check_ready, index.identity, lambda: index.dense_hits(np.ones(4, np.float32), 3),
                 lambda: index.has_id("a")):
        with pytest.raises(IndexUnavailableError, match="127.0.0.1:1"):
            call()
    assert index.has_lexical  # unknown until it answers: the retrievers stay offered, and answer 503


def test_a_collection_of_another_model_is_refused(built):
    index, encoder = built
    index.check_model(encoder.name, encoder.weights_hash, encoder.dim)
    with pytest.raises(IndexMismatchError, match="rebuild"):
        index.check_model("another-model", None, None)


@pytest.mark.parametrize("engine", ["client", "edge"])
def test_building_over_an_existing_collection_needs_recreate(tmp_path, engine):
    config, docs = QdrantConfig(str(tmp_path / "q"), "t", engine=engine), make_docs(5)
    build_qdrant(docs, {"primary": FakeEncoder()}, config, progress=False).close()
    with pytest.raises(ValueError, match="--recreate"):
        build_qdrant(docs, {"primary": FakeEncoder()}, config, progress=False)
    rebuilt = build_qdrant(docs[:2], {"primary": FakeEncoder()}, config, progress=False, recreate=True)
    assert rebuilt.size == 2
    rebuilt.close()


def test_a_collection_without_metadata_says_how_to_build_it(tmp_path):
    from qdrant_client import QdrantClient

    client = QdrantClient(path=str(tmp_path / "q"))
    index = QdrantIndex(QdrantConfig(str(tmp_path / "q"), "absent"), client)
    with pytest.raises(IndexUnavailableError, match="absent"):
        index.check_ready()
    client.close()


def test_edge_scores_as_local_mode_after_writes_and_deletes(tmp_path):
    """The same collection on both engines, then the same writes (a document whose text has no BM25 term among
    them) and deletes: dense and BM25 answers agree, scores included (edge's IDF is over the live points holding the
    sparse vector, as local mode's; its default IDF would still count the deleted ones)."""
    encoder, docs = FakeEncoder(), make_docs(60)
    client = build_qdrant(docs, {"primary": encoder}, QdrantConfig(str(tmp_path / "c"), "t"), progress=False)
    edge = build_qdrant(docs, {"primary": encoder}, QdrantConfig(str(tmp_path / "e"), "t", engine="edge"),
                        progress=False)
    new = [Document("n1", "", "w1 w2 w3 w1"), Document("n2", "", "the and of"), Document("n3", "w7", "w7 w8")]
    for index in (client, edge):
        index.upsert(new, vectors_of(encoder, new))
        index.delete([docs[1].id, docs[2].id, docs[3].id])
        assert index.size == 60
    queries = ["w1 w7", "w2 w3 w400", "w8", " ".join(docs[4].text.split()[:3])]
    for query in queries:
        want, got = client.lexical_hits(query, 15), edge.lexical_hits(query, 15)
        assert len(want) > 0 and sorted(got.ids) == sorted(want.ids)
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
        vector = encoder.encode_queries([query])[0]
        want, got = client.dense_hits(vector, 10), edge.dense_hits(vector, 10)
        assert got.ids == want.ids
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.vectors, want.vectors, atol=1e-6)
    rows = edge.rows_for_ids(["n1", "d5"])
    np.testing.assert_allclose(edge.lexical_scores_of("w1 w2", rows), client.lexical_scores_of("w1 w2", rows),
                               rtol=1e-5, atol=1e-6)
    client.close()
    edge.close()


def test_an_edge_write_survives_a_reopen(tmp_path):
    encoder, config = FakeEncoder(), QdrantConfig(str(tmp_path / "e"), "t", engine="edge")
    index = build_qdrant(make_docs(10), {"primary": encoder}, config, progress=False)
    doc = Document("kept", "", "w9 w9 w10")
    index.upsert([doc], vectors_of(encoder, [doc]))
    index.delete(["d0"])
    version = index.version
    index.close()
    again = QdrantIndex(config)
    again.check_ready()
    assert (again.version, again.size) == (version, 10)
    assert again.documents(again.rows_for_ids(["kept"])) == [doc] and not again.has_id("d0")
    again.close()


KILLED_WRITER = """
import os, signal, sys
from sieve.index import Document
from sieve.index.qdrant_backend import QdrantConfig, QdrantIndex
from tests.index.conftest import FakeEncoder
index, encoder = QdrantIndex(QdrantConfig(sys.argv[1], "t", engine="edge")), FakeEncoder()
for i in range(20):
    doc = Document(f"acked-{i}", "", f"zanzibar clove number{i}")
    index.upsert([doc], {"primary": encoder.encode_documents([doc.full_text], progress=False)})
    print(doc.id, flush=True)  # acknowledged
os.kill(os.getpid(), signal.SIGKILL)  # no close(), no flush: the process dies as a crashed server would
"""


def test_edge_writes_acknowledged_before_a_kill_are_all_there(tmp_path):
    import signal
    import subprocess
    import sys
    from pathlib import Path

    config = QdrantConfig(str(tmp_path / "qdrant"), "t", engine="edge")
    build_qdrant(make_docs(10), {"primary": FakeEncoder()}, config, progress=False).close()
    run = subprocess.run([sys.executable, "-c", KILLED_WRITER, config.location], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == -signal.SIGKILL, run.stderr
    acked = run.stdout.split()
    assert len(acked) == 20
    index = QdrantIndex(config)
    try:
        assert all(index.has_id(doc_id) for doc_id in acked)
        assert index.refresh_size() == 30
        assert set(index.lexical_hits("zanzibar clove", 30).ids) == set(acked)
    finally:
        index.close()
