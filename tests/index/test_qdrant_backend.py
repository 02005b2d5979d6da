"""The Qdrant backend's writes and faults, on the client's local mode (a real Qdrant engine in process, on disk):
writes are visible to the next read, a write Qdrant refuses acknowledges nothing, an unreachable server is a clear
IndexUnavailableError, a collection built by another model is refused, BM25 follows writes."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.index import Document, IndexMismatchError, UnknownDocumentError
from sieve.index.errors import IndexUnavailableError
from sieve.index.qdrant_backend import QdrantConfig, QdrantIndex, point_id
from sieve.index.qdrant_build import build_qdrant
from tests.index.conftest import FakeEncoder, make_docs


@pytest.fixture
def built(tmp_path):
    encoder = FakeEncoder()
    index = build_qdrant(make_docs(40), {"primary": encoder}, QdrantConfig(str(tmp_path / "qdrant"), "t"),
                         progress=False)
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


def test_building_over_an_existing_collection_needs_recreate(tmp_path):
    config, docs = QdrantConfig(str(tmp_path / "q"), "t"), make_docs(5)
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
