from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sieve.index import Document, SearchIndex, add_documents, add_store, build_index, delete_documents

from .conftest import FakeEncoder


def _expected(encoder: FakeEncoder, docs) -> np.ndarray:
    return encoder.encode_documents([d.full_text for d in docs])


def test_extra_store_round_trip(tmp_path: Path, docs, encoder) -> None:
    cmc = FakeEncoder(name="cmc", dim=8, seed=1)
    m = build_index(docs, encoder, tmp_path / "i", extra_stores={"cmc": cmc}, progress=False)
    assert m.stores == {"cmc": {"model_name": "cmc", "model_hash": cmc.weights_hash, "dim": 8}}
    with SearchIndex.load(tmp_path / "i") as index:
        assert index.has_store("cmc") and not index.has_store("other")
        got = index.embeddings([4, 2], store="cmc")
        np.testing.assert_allclose(got, _expected(cmc, [docs[4], docs[2]]), atol=1e-6)


def test_add_documents_requires_store_encoder(tmp_path: Path, docs, encoder) -> None:
    cmc = FakeEncoder(name="cmc", dim=8, seed=1)
    out = tmp_path / "i"
    build_index(docs, encoder, out, extra_stores={"cmc": cmc}, progress=False)
    new = [Document("n", "", "zebra"), Document("d2", "t", "replaced text")]
    with pytest.raises(ValueError, match="missing: \\['cmc'\\]"):
        add_documents(out, new, {"primary": encoder})
    add_documents(out, new, {"primary": encoder, "cmc": cmc})
    delete_documents(out, ["d0"])
    with SearchIndex.load(out) as index:
        rows = index.rows_for_ids(["n", "d2", "d5"])
        got = index.embeddings(rows, store="cmc")
    np.testing.assert_allclose(got, _expected(cmc, [new[0], new[1], docs[5]]), atol=1e-6)


def test_add_store_to_existing_index(built: Path, docs, encoder) -> None:
    cmc = FakeEncoder(name="cmc", dim=8, seed=1)
    m = add_store(built, "cmc", cmc, cache_dir=built.parent / "cache", progress=False)
    assert m.version == 2 and "cmc" in m.stores
    replacement = FakeEncoder(name="cmc", dim=8, seed=2)
    m = add_store(built, "cmc", replacement, progress=False)
    assert m.stores["cmc"]["model_hash"] == replacement.weights_hash
    with SearchIndex.load(built) as index:
        np.testing.assert_allclose(index.embeddings([1], store="cmc"),
                                   _expected(replacement, [docs[1]]), atol=1e-6)
        # the primary side is untouched
        np.testing.assert_allclose(index.embeddings([1]), _expected(encoder, [docs[1]]), atol=1e-6)
        assert index.documents([1]) == [docs[1]]


def test_store_encoder_mismatch(tmp_path: Path, docs, encoder) -> None:
    from sieve.index import IndexMismatchError
    out = tmp_path / "i"
    build_index(docs, encoder, out, extra_stores={"cmc": FakeEncoder(name="cmc", dim=8)},
                progress=False)
    with pytest.raises(IndexMismatchError, match="store 'cmc'.*differing: dim"):
        add_documents(out, [Document("n", "", "x")],
                      {"primary": encoder, "cmc": FakeEncoder(name="cmc", dim=16)})
