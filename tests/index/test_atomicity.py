from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from sieve.index import Document, SearchIndex, add_documents, compact, delete_documents
from sieve.index.layout import read_current

from .conftest import make_docs

NEW = [Document("new", "", "zebra quokka")]


def _fail(*_args, **_kwargs):
    raise OSError("simulated failure")


def _assert_v1_intact(index_dir: Path, docs) -> None:
    assert read_current(index_dir) == "v000001"
    with SearchIndex.load(index_dir) as index:
        assert (index.version, index.size) == (1, 300)
        assert index.documents([0, 299]) == [docs[0], docs[299]]
        assert index.embeddings([0, 299]).shape == (2, 32)


def test_failure_at_current_switch_keeps_old_version(built: Path, docs, encoder,
                                                     monkeypatch) -> None:
    monkeypatch.setattr(os, "replace", _fail)
    with pytest.raises(OSError, match="simulated failure"):
        add_documents(built, NEW, {"primary": encoder})
    monkeypatch.undo()
    _assert_v1_intact(built, docs)
    # The renamed but never-live v000002 must not block the next write.
    m = add_documents(built, NEW, {"primary": encoder})
    with SearchIndex.load(built) as index:
        assert m.version == index.version == 2 and index.size == 301


@pytest.mark.parametrize("target", ["save", "rename"])  # a delete stages its tombstones (np.save), then renames
def test_failure_while_staging_leaves_no_trace(built: Path, docs, encoder, monkeypatch,
                                               target) -> None:
    monkeypatch.setattr(np if target == "save" else os, target, _fail)
    with pytest.raises(OSError, match="simulated failure"):
        delete_documents(built, ["d1"])
    monkeypatch.undo()
    _assert_v1_intact(built, docs)
    assert [p.name for p in (built / "versions").iterdir()] == ["v000001"]


def test_leftover_temp_dir_from_killed_writer(built: Path, docs, encoder) -> None:
    torn = built / "versions" / ".tmp-deadbeef"
    torn.mkdir()
    (torn / "embeddings.npy").write_bytes(b"\x93NUMPY half-written")
    _assert_v1_intact(built, docs)
    add_documents(built, NEW, {"primary": encoder})
    assert not torn.exists()


def test_loaded_index_outlives_pruning(built: Path, docs, encoder) -> None:
    old = SearchIndex.load(built)
    for i in range(3):
        add_documents(built, make_docs(1, seed=i, prefix=f"n{i}"), {"primary": encoder})
    compact(built)  # one merged segment: the build's segment v000001 is no longer listed, and is deleted
    assert not (built / "versions" / "v000001").exists()
    q = encoder.encode_queries([docs[7].full_text])
    _, rows = old.search(q, 1)
    assert old.ids(rows[0]) == ["d7"] and old.documents([7]) == [docs[7]]
    np.testing.assert_allclose(old.embeddings([7]), q, atol=1e-6)
    old.close()
    with SearchIndex.load(built) as new:
        assert (new.version, new.size) == (5, 303)


def test_load_retries_when_version_pruned_underneath(built: Path, encoder, monkeypatch) -> None:
    import sieve.index.search_index as si
    real, calls = si._open_parts, []

    def racing(vdir, *args):
        calls.append(vdir.name)
        if len(calls) == 1:  # a writer publishes v2 while we open v1, whose files vanish
            add_documents(built, NEW, {"primary": encoder})
            raise FileNotFoundError(vdir / "faiss.index")
        return real(vdir, *args)

    monkeypatch.setattr(si, "_open_parts", racing)
    with SearchIndex.load(built) as index:
        assert calls == ["v000001", "v000002"] and index.version == 2
