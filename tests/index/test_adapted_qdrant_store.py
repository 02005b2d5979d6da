"""The adapted-CMC store of a Qdrant collection (index/adapted_qdrant.py) on both engines here, the client's local mode
and qdrant-edge: files larger than a chunk come back byte for byte, versions count up, the previous one is kept and
older ones' points are deleted, writes to the documents keep the live record, a damaged part is refused, and every
other collection (another name, or this one rebuilt) starts without one."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.index.adapted import AdaptedStore, store_for
from sieve.index.adapted_qdrant import CHUNK, QdrantAdapted, chunk_id
from sieve.index.qdrant_backend import QdrantConfig, QdrantIndex
from sieve.index.qdrant_build import build_qdrant
from tests.index.conftest import FakeEncoder, make_docs


@pytest.fixture(params=["client", "edge"])
def collection(request, tmp_path):
    config = QdrantConfig(str(tmp_path / "qdrant"), "t", engine=request.param)
    index = build_qdrant(make_docs(12), {"primary": FakeEncoder()}, config, progress=False)
    yield index
    index.close()


def checkpoint(store: AdaptedStore, seed: int) -> dict[str, bytes]:
    """A work directory of files as a checkpoint has them, one spanning three chunks; returns their contents."""
    files = {"cmc.safetensors": np.random.default_rng(seed).bytes(2 * CHUNK + 123),
             "config.json": b'{"seed": %d}' % seed, "documents.txt": b""}
    work = store.new_work_dir()
    for name, data in files.items():
        (work / name).write_bytes(data)
    return {"work": work, **files}


def test_publish_then_read_back_elsewhere(collection, tmp_path):
    store = store_for(collection, tmp_path / "unused-local-dir", tmp_path / "cache")
    assert isinstance(store, QdrantAdapted) and store.current() is None  # never adapted
    written = checkpoint(store, seed=1)
    live = store.publish(written.pop("work"))
    assert live.name == "a000001" and store.current() == live and store.owns(live)
    fetched = QdrantAdapted(collection, tmp_path / "another-machine").current()
    assert fetched != live and {p.name: p.read_bytes() for p in fetched.iterdir() if p.name in written} == written
    assert not store.owns(tmp_path / "unused-local-dir" / "adapted" / "a000001")


def test_versions_count_up_keep_the_previous_and_survive_document_writes(collection, tmp_path):
    store = QdrantAdapted(collection, tmp_path / "cache")
    first = store.publish(checkpoint(store, 1)["work"])
    second = store.publish(checkpoint(store, 2)["work"])
    collection.delete([make_docs(12)[0].id])  # a write moves the generation, not the adapted record
    assert store.current() == second and store.record()["kept"][0]["version"] == first.name
    third = store.publish(checkpoint(store, 3)["work"])
    assert (third.name, store.record()["kept"][0]["version"]) == ("a000003", "a000002")
    gone = [chunk_id(first.name, "cmc.safetensors", i) for i in range(3)]
    assert collection.call("t", lambda e: e.retrieve(collection.meta_name, gone, False, False)) == []


def test_a_damaged_part_is_refused(collection, tmp_path):
    store = QdrantAdapted(collection, tmp_path / "cache")
    live = store.publish(checkpoint(store, 1)["work"])
    point = chunk_id(live.name, "config.json", 0)
    collection.call("t", lambda e: e.set_payload(collection.meta_name, point, {"data": "e30="}))  # "{}"
    with pytest.raises(ValueError, match="does not match its sha256"):
        QdrantAdapted(collection, tmp_path / "elsewhere").current()
    assert store.current() == live  # a complete local copy is served as it is


def test_another_collection_or_a_rebuild_has_none(collection, tmp_path):
    store = QdrantAdapted(collection, tmp_path / "cache")
    store.publish(checkpoint(store, 1)["work"])
    config = collection.config
    collection.close()
    other = build_qdrant(make_docs(12), {"primary": FakeEncoder()}, QdrantConfig(config.location, "other",
                         engine=config.engine), progress=False)
    try:
        assert QdrantAdapted(other, tmp_path / "cache").current() is None
    finally:
        other.close()
    rebuilt = build_qdrant(make_docs(12), {"primary": FakeEncoder()}, config, progress=False, recreate=True)
    try:
        rebuilt_store = QdrantAdapted(rebuilt, tmp_path / "cache")
        assert rebuilt_store.current() is None and rebuilt_store.root != store.root
    finally:
        rebuilt.close()
