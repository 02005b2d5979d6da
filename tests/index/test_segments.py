"""Incremental versions: a write adds a segment and tombstones, merges fold segments without blocking writes, and
every version answers exactly what one index freshly built over its live documents would answer."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sieve.index import Document, SearchIndex, apply_changes, build_index, compact, merge_if_due
from sieve.index.compaction import MergePolicy, merge
from sieve.index.layout import read_current
from sieve.index.lexical import LexicalConfig
from sieve.index.manifest import Manifest

from .conftest import FakeEncoder, make_docs

REPO = Path(__file__).resolve().parents[2]
PLAIN = LexicalConfig(language="none")


def _versions(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "versions").iterdir())


def _check_like_fresh(path: Path, live: dict[str, Document], encoder, tmp_path: Path) -> None:
    """The index at `path` holds exactly `live`, and search + BM25 match a fresh single-segment build of them."""
    fresh_dir = tmp_path / f"fresh-{random.random()}"
    with SearchIndex.load(path) as index:
        docs = index.documents(range(index.size))
        assert {d.id: d for d in docs} == live and index.size == len(live)
        build_index(docs, encoder, fresh_dir, progress=False, lexical=PLAIN, faiss_kind="flat")
        with SearchIndex.load(fresh_dir) as fresh:
            queries = encoder.encode_queries([docs[i].full_text for i in range(0, len(docs), 7)])
            got, want = index.search(queries, 10), fresh.search(queries, 10)
            np.testing.assert_array_equal(got[1], want[1])
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
            for text in ("w1 w2 w3", docs[0].text, "w399 w17"):
                np.testing.assert_allclose(index.lexical_scores(text), fresh.lexical_scores(text), rtol=1e-5)


def test_random_writes_merges_and_compaction_match_a_fresh_build(tmp_path, encoder):
    path, rng = tmp_path / "idx", random.Random(7)
    docs = make_docs(120)
    build_index(docs, encoder, path, progress=False, lexical=PLAIN)
    live = {d.id: d for d in docs}
    for step in range(14):
        added = [Document(f"s{step}-{i}", "", " ".join(rng.choices([f"w{j}" for j in range(400)], k=9)))
                 for i in range(rng.randint(0, 4))]
        added += [Document(i, "new", f"w{step} w{step + 1} replaced {i}") for i in rng.sample(sorted(live), 2)]
        gone = [i for i in rng.sample(sorted(live), 3) if i not in {d.id for d in added}]
        apply_changes(path, added, gone, {"primary": encoder})
        for i in gone:
            live.pop(i)
        live.update({d.id: d for d in added})
        if step == 6:
            _check_like_fresh(path, live, encoder, tmp_path)
            while merge_if_due(path, MergePolicy(max_segments=4, merge_width=3)) is not None:
                pass
            with SearchIndex.load(path) as index:
                assert len(index.manifest.segments) <= 4
    _check_like_fresh(path, live, encoder, tmp_path)
    with SearchIndex.load(path) as before:
        order = before.ids(range(before.size))
        corpus = before.manifest.corpus_hash
    m = compact(path)
    assert (len(m.segments), m.deleted, m.corpus_hash) == (1, 0, corpus)
    assert _versions(path) == [read_current(path)]  # nothing else is listed any more: freed
    with SearchIndex.load(path) as index:
        assert index.ids(range(index.size)) == order  # a merge renumbers no live document
    _check_like_fresh(path, live, encoder, tmp_path)


def test_a_write_holds_only_its_documents_and_tombstones(built: Path, encoder):
    base = built / "versions" / "v000001"
    inode = (base / "embeddings.npy").stat().st_ino
    apply_changes(built, [Document("n1", "", "zebra quokka")], ["d5"], {"primary": encoder})
    v2 = built / "versions" / "v000002"
    assert np.load(v2 / "embeddings.npy").shape == (1, encoder.dim)
    assert np.load(v2 / "deleted.npy").tolist() == [(1 << 32) | 5]  # segment v000001, local row 5
    assert (base / "embeddings.npy").stat().st_ino == inode  # the build's segment is listed, not copied
    apply_changes(built, [], ["d6"], {})
    assert sorted(p.name for p in (built / "versions" / "v000003").iterdir()) == ["deleted.npy", "manifest.json"]
    with SearchIndex.load(built) as index:
        assert [s["name"] for s in index.manifest.segments] == ["v000001", "v000002"]
        assert (index.size, index.manifest.deleted) == (299, 2)
        assert not index.has_id("d5") and not index.has_id("d6") and index.has_id("n1")


def test_a_reload_opens_only_new_segments(built: Path, encoder):
    with SearchIndex.load(built) as old:
        apply_changes(built, [Document("n1", "", "zebra quokka")], [], {"primary": encoder})
        with SearchIndex.load(built) as new:
            assert new._p.segments[0] is old._p.segments[0]  # the same open files and id map
            assert new._p.segments[1].name == "v000002"
        assert old.documents([0])[0].id == "d0"  # closing the new version leaves the shared segment open


def test_writes_during_a_merge_are_kept(tmp_path, encoder, monkeypatch):
    path = tmp_path / "idx"
    build_index(make_docs(50), encoder, path, progress=False, lexical=PLAIN)
    for i in range(3):
        apply_changes(path, [Document(f"a{i}", "", f"alpha w{i}")], [], {"primary": encoder})
    import sieve.index.compaction as compaction

    real = compaction.write_segment

    def write_then_race(*args):  # the merge wrote its segment without the lock: writers go on meanwhile
        real(*args)
        apply_changes(path, [Document("late", "", "late arrival")], ["a1", "d3"], {"primary": encoder})

    monkeypatch.setattr(compaction, "write_segment", write_then_race)
    m = merge(path, lambda m: (0, 3))  # the build's segment and the first two writes
    assert m is not None and [s["rows"] for s in m.segments] == [52, 1, 1]
    with SearchIndex.load(path) as index:
        ids = index.ids(range(index.size))
        assert "a1" not in ids and "d3" not in ids and ids[-2:] == ["a2", "late"] and index.size == 52
        assert index.manifest.deleted == 2  # carried into the merged segment's numbering
        _, rows = index.search(encoder.encode_queries(["alpha w0"]), 3)
        assert index.ids(rows[0])[0] == "a0"


def test_merge_policy_picks_the_lightest_adjacent_run():
    def manifest(rows, deleted=0) -> Manifest:
        return Manifest(2, "m", "h", 4, sum(rows) - deleted, "float32", "auto", {}, "", "", 1,
                        segments=[{"name": f"v{i:06d}", "rows": r} for i, r in enumerate(rows)], deleted=deleted)

    policy = MergePolicy(max_segments=4, merge_width=3, deleted_fraction=0.5)
    assert policy.run(manifest([100, 5, 5, 5])) is None
    assert policy.run(manifest([100, 50, 5, 1, 1])) == (2, 5)
    assert policy.run(manifest([100, 1, 1, 1, 50])) == (1, 4)
    assert policy.run(manifest([100, 5], deleted=60)) == (0, 2)


def _clustered(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((32, dim)).astype(np.float32)
    x = centers[rng.integers(0, 32, n)] + 0.5 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class VectorEncoder(FakeEncoder):
    """Document i's text is "v<i>": its vector is row i of a fixed clustered matrix."""

    def __init__(self, vectors: np.ndarray):
        super().__init__(name="vectors", dim=vectors.shape[1])
        self.vectors = vectors

    def encode_documents(self, texts, progress=True):
        return self.vectors[[int(t.split()[-1][1:]) for t in texts]]


def test_auto_uses_ivf_from_the_threshold_and_hides_deleted_rows(tmp_path):
    vectors = _clustered(3000, 32, seed=3)
    enc = VectorEncoder(vectors)
    docs = [Document(f"d{i}", "", f"v{i}") for i in range(2900)]
    path = tmp_path / "ann"
    build_index(docs, enc, path, progress=False, faiss_params={"ann_min_rows": 1000}, lexical=None)
    apply_changes(path, [Document(f"d{i}", "", f"v{i}") for i in range(2900, 3000)], ["d0", "d1"], {"primary": enc})
    queries = vectors[:40] + 0.05
    exact = np.argsort(-(queries @ vectors[2:].T), axis=1)[:, :50] + 2  # doc rows of the live set, best first
    for expected in (["ivf", "flat"], ["ivf"]):  # after a write, then after compaction
        with SearchIndex.load(path, nprobe=16) as index:
            assert [s["ann"] for s in index.manifest.segments] == expected
            base = path / "versions" / index.manifest.segments[0]["name"]
            # the IVF index holds the vectors: no second copy, and embeddings() reads them from it
            assert (base / "faiss.index").is_file() and not (base / "embeddings.npy").exists()
            np.testing.assert_array_equal(index.embeddings([0, 2997]), vectors[[2, 2999]])
            _, rows = index.search(queries, 50)
            got = [set(index.ids(r)) for r in rows]
            recall = np.mean([len(g & {f"d{i}" for i in e}) / 50 for g, e in zip(got, exact)])
            assert recall >= 0.9, recall
            assert not any({"d0", "d1"} & g for g in got)  # the IVF segment's tombstones, applied by a selector
        compact(path)


KILLED_MERGE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    import sieve.index.{module} as target
    from sieve.index import compact

    real = target.{function}
    def killed(*args, **kwargs):
        real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)  # a real crash: no cleanup runs
    target.{function} = killed
    compact({path!r})
""")


@pytest.mark.parametrize("module,function", [("compaction", "write_segment"), ("layout", "_fsync_tree")])
def test_a_killed_merge_changes_nothing(tmp_path, encoder, module, function):
    path = tmp_path / "idx"
    build_index(make_docs(40), encoder, path, progress=False, lexical=PLAIN)
    apply_changes(path, [Document("n", "", "zebra")], ["d2"], {"primary": encoder})
    script = KILLED_MERGE.format(repo=str(REPO), module=module, function=function, path=str(path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert read_current(path) == "v000002"
    with SearchIndex.load(path) as index:
        assert index.size == 40 and index.has_id("n") and not index.has_id("d2")
    m = compact(path)  # the next merge clears what the killed one left and goes through
    assert len(m.segments) == 1 and not [p for p in os.listdir(path / "versions") if p.startswith(".")]
