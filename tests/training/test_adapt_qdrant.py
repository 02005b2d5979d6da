"""`sieve adapt` on a Qdrant collection (issue 35), on the client's local mode and on qdrant-edge: it reads the
collection through the index contract and publishes the model into the collection itself, where a server on another
machine finds it (fetched into its own cache, checked against the collection's sha256s)."""
from __future__ import annotations

import pytest

from sieve.cli import main
from sieve.index import read_beir_corpus
from sieve.index.adapted_qdrant import QdrantAdapted
from sieve.index.qdrant_backend import QdrantConfig, QdrantIndex
from tests.conftest import DEMO_CORPUS
from tests.service.adapted_helpers import build_collection, sha256

EDGE = "qdrant-edge"


@pytest.mark.parametrize("backend", ["qdrant", EDGE])
def test_sieve_adapt_on_a_collection_publishes_into_the_collection(backend, tmp_path, biencoder, cache_dir,
                                                                   monkeypatch, capsys):
    path, engine = tmp_path / "q", "edge" if backend == EDGE else "client"
    build_collection(path, biencoder, cache_dir, engine)
    monkeypatch.setenv("SIEVE_CACHE_DIR", str(tmp_path / "cache"))
    flag = "--qdrant-edge-path" if backend == EDGE else "--qdrant-url"
    try:
        main(["adapt", "--backend", backend, flag, str(path), "--collection", "demo", "--steps", "50", "--no-progress"])
    except SystemExit as exc:
        pytest.fail(f"sieve adapt exited {exc.code}: {capsys.readouterr().err[-3000:]}")
    assert "60 pseudo-queries (ict) from 60 documents" in capsys.readouterr().err
    index = QdrantIndex(QdrantConfig(str(path), "demo", engine=engine))
    try:
        published = QdrantAdapted(index, tmp_path / "cache" / "adapted").current()
        assert published is not None and published.name == "a000001"
        assert sorted(p.name for p in published.parent.iterdir()) == ["a000001"]  # no .work, no .lock left
        fresh = QdrantAdapted(index, tmp_path / "elsewhere").current()  # another machine: fetched from Qdrant
        assert fresh != published and sha256(fresh / "cmc.safetensors") == sha256(published / "cmc.safetensors")
        ids = set((fresh / "documents.txt").read_text().split())
        assert ids == {d.id for d in read_beir_corpus(DEMO_CORPUS)}
        assert index.load_meta(force=True)["adapted"]["live"]["version"] == "a000001"
    finally:
        index.close()
