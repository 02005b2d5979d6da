from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sieve.index import (Document, IndexFormatError, IndexMismatchError, IndexNotFoundError,
                   SearchIndex, UnknownDocumentError, add_documents, build_index,
                   delete_documents)
from sieve.index.layout import read_current

from .conftest import FakeEncoder, make_docs


def _top1(index: SearchIndex, encoder: FakeEncoder, text: str) -> str:
    _, rows = index.search(encoder.encode_queries([text]), 1)
    return index.ids(rows[0])[0]


def test_add_new_and_replace(built: Path, docs, encoder) -> None:
    new = Document("new1", "fresh", "zebra quokka axolotl")
    changed = Document("d3", "changed", "platypus narwhal okapi")
    m = add_documents(built, [new, changed], {"primary": encoder})
    assert (m.version, m.count) == (2, 301)
    with SearchIndex.load(built) as index:
        assert (index.version, index.size) == (2, 301)
        # the replaced d3 leaves its row (tombstoned) and joins the write's segment after new1
        assert index.rows_for_ids(["d3", "new1", "d4"]) == [300, 299, 3]
        assert index.documents([300, 299]) == [changed, new]
        assert _top1(index, encoder, "zebra quokka axolotl") == "new1"
        assert _top1(index, encoder, "platypus narwhal okapi") == "d3"
        np.testing.assert_allclose(index.embeddings([300])[0],
                                   encoder.encode_documents([changed.full_text])[0], atol=1e-6)
        np.testing.assert_allclose(index.embeddings([3])[0],
                                   encoder.encode_documents([docs[4].full_text])[0], atol=1e-6)


def test_add_encodes_only_new_docs(built: Path, encoder) -> None:
    before = encoder.texts_seen
    add_documents(built, make_docs(3, seed=9, prefix="x"), {"primary": encoder})
    assert encoder.texts_seen - before == 3


def test_add_rejects_bad_input(built: Path, encoder) -> None:
    dup = [Document("x", "", "a"), Document("x", "", "b")]
    with pytest.raises(ValueError, match="duplicate document id.*'x'"):
        add_documents(built, dup, {"primary": encoder})
    with pytest.raises(ValueError, match="encoders\\['primary'\\] is required"):
        add_documents(built, [Document("y", "", "a")], {})
    with pytest.raises(IndexMismatchError, match="differing: model_hash"):
        add_documents(built, [Document("y", "", "a")], {"primary": FakeEncoder(seed=5)})
    with pytest.raises(ValueError, match="unexpected: \\['cmc'\\]"):
        add_documents(built, [Document("y", "", "a")], {"primary": encoder, "cmc": encoder})
    assert read_current(built) == "v000001"


def test_delete(built: Path, docs, encoder) -> None:
    m = delete_documents(built, ["d0", "d10", "d10"])
    assert (m.version, m.count) == (2, 298)
    with SearchIndex.load(built) as index:
        assert index.ids([0, 1, 8, 9]) == ["d1", "d2", "d9", "d11"]
        with pytest.raises(UnknownDocumentError):
            index.rows_for_ids(["d10"])
        assert _top1(index, encoder, docs[10].full_text) != "d10"
        assert _top1(index, encoder, docs[11].full_text) == "d11"
        np.testing.assert_allclose(index.embeddings([9])[0],
                                   encoder.encode_documents([docs[11].full_text])[0], atol=1e-6)


def test_delete_unknown_ids_changes_nothing(built: Path) -> None:
    files = sorted(p.name for p in (built / "versions").iterdir())
    with pytest.raises(UnknownDocumentError, match="2 unknown document id.*'zz1', 'zz2'"):
        delete_documents(built, ["d1", "zz1", "zz2"])
    assert read_current(built) == "v000001"
    assert sorted(p.name for p in (built / "versions").iterdir()) == files
    with SearchIndex.load(built) as index:
        assert index.size == 300 and index.rows_for_ids(["d1"]) == [1]


def test_delete_everything_refused(tmp_path: Path, encoder) -> None:
    build_index(make_docs(2), encoder, tmp_path / "i", progress=False)
    with pytest.raises(ValueError, match="cannot delete every document"):
        delete_documents(tmp_path / "i", ["d0", "d1"])


def test_versions_increment_and_old_ones_pruned(built: Path, docs, encoder) -> None:
    add_documents(built, make_docs(2, seed=3, prefix="a"), {"primary": encoder})
    delete_documents(built, ["a0"])
    m = build_index(docs, encoder, built, progress=False)  # rebuild in place
    assert m.version == 4 and read_current(built) == "v000004"
    # the previous version stays, and so do the segments it lists (v1: the build, v2: the add; v3 only deletes)
    assert sorted(p.name for p in (built / "versions").iterdir()) == ["v000001", "v000002", "v000003", "v000004"]
    add_documents(built, make_docs(1, seed=4, prefix="b"), {"primary": encoder})
    assert sorted(p.name for p in (built / "versions").iterdir()) == ["v000004", "v000005"]


def test_ivf_index_survives_updates(tmp_path: Path, encoder) -> None:
    out = tmp_path / "ivf"
    build_index(make_docs(200), encoder, out, faiss_kind="ivf", faiss_params={"nlist": 5},
                progress=False)
    add_documents(out, [Document("z", "", "zebra quokka")], {"primary": encoder})
    delete_documents(out, [f"d{i}" for i in range(198)])
    with SearchIndex.load(out) as index:
        assert index.size == 3 and index.manifest.faiss_kind == "ivf"
        assert _top1(index, encoder, "zebra quokka") == "z"


def test_updates_need_a_built_index(tmp_path: Path, encoder) -> None:
    with pytest.raises(IndexNotFoundError):
        add_documents(tmp_path / "none", [Document("a", "", "b")], {"primary": encoder})
    with pytest.raises(IndexNotFoundError):
        delete_documents(tmp_path / "none", ["a"])


def test_rebuild_over_damaged_current(built: Path, docs, encoder) -> None:
    (built / "CURRENT").write_text("garbage\n")
    with pytest.raises(IndexFormatError, match="expected a version name"):
        SearchIndex.load(built)
    m = build_index(docs[:10], encoder, built, progress=False)
    assert m.version == 2
    with SearchIndex.load(built) as index:
        assert (index.version, index.size) == (2, 10)
