"""Writing one index version: at most one new segment, the tombstones, the manifest; staged, fsynced, published."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import faiss
import numpy as np

from .corpus import Document, corpus_hash, hash_strings
from .errors import IndexDiskFullError
from .layout import KEEP_VERSIONS, commit_version, current_version_dir, staging_dir
from .lexical import LexicalConfig, write_lexical
from .manifest import Manifest, read_manifest, utc_now, write_manifest
from .segments import TOMBSTONES_FILE, local_tombstones, open_vectors, read_tombstones, segment_dir
from .storage import (DOCS_FILE, FAISS_FILE, connect_readonly, link_or_copy, open_embeddings, read_all_docs, store_path,
                      write_docs, write_embeddings)
from .vectors import build_faiss


@dataclass
class Rows:
    """Embedding rows for one store of a new segment, produced lazily in blocks."""
    shape: tuple[int, int]
    parts: Callable[[], Iterable[np.ndarray]]


@dataclass
class SegmentPlan:
    """The one new segment a version writes (a build, a write's delta, a merge)."""
    docs: list[Document]
    arrays: dict[str | None, Rows]  # None key: primary
    ann: str = "flat"                # flat | ivf | hnsw (vectors.segment_ann)
    faiss_params: dict = field(default_factory=dict)
    lexical_terms: tuple | None = None  # lexical.tokenized() of the docs, when the caller made it already


@dataclass
class VersionPlan:
    """Everything a new version holds: its manifest, at most one new segment (the manifest lists it last or in the
    place of the segments it merges), and the tombstones of every segment it lists."""
    manifest: Manifest
    segment: SegmentPlan | None = None
    tombstones: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    extra_files: dict[str, Path] = field(default_factory=dict)  # relative path -> source copied in (anncur.json)


@dataclass
class LiveVersion:
    """The version a modification starts from (read under the writer lock, or as a merge's snapshot)."""
    index_dir: Path
    path: Path
    manifest: Manifest
    tombstones: np.ndarray

    @classmethod
    def open(cls, index_dir: Path) -> "LiveVersion":
        path = current_version_dir(index_dir)
        return cls(index_dir, path, read_manifest(path), read_tombstones(path))

    def segment_path(self, name: str) -> Path:
        return segment_dir(self.index_dir, name)

    def find(self, ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        """Where each live id of `ids` is: id -> (segment, local row). One indexed query per segment."""
        wanted, found = json.dumps(sorted(set(ids))), {}
        for spec in reversed(self.manifest.segments):  # an id lives in at most one segment: the newest holding it
            conn = connect_readonly(self.segment_path(spec["name"]) / DOCS_FILE)
            try:
                hits = conn.execute("SELECT id, row FROM docs WHERE id IN (SELECT value FROM json_each(?))",
                                    (wanted,)).fetchall()
            finally:
                conn.close()
            dead = set(local_tombstones(self.tombstones, spec["name"]).tolist())
            for doc_id, row in hits:
                if row not in dead and doc_id not in found:
                    found[doc_id] = (spec["name"], row)
        return found

    def docs(self, name: str | None = None) -> list[Document]:
        """The documents of one segment (all rows), or with no name every live document in live row order."""
        if name is not None:
            return read_all_docs(self.segment_path(name) / DOCS_FILE)
        out = []
        for spec in self.manifest.segments:
            dead = set(local_tombstones(self.tombstones, spec["name"]).tolist())
            out += [d for r, d in enumerate(self.docs(spec["name"])) if r not in dead]
        return out

    def embeddings(self, name: str, store: str | None = None):
        return open_vectors(self.segment_path(name), store)


def chained_hash(previous: str, added: Sequence[Document], removed: Iterable[str]) -> str:
    """The corpus identity after a write, in O(write): the previous identity, the added documents, the removed ids.
    (A build or a full compaction writes corpus_hash(docs) of its documents instead.)"""
    return hash_strings([previous, corpus_hash(added), *sorted(removed)])


def finish_manifest(manifest: Manifest, docs: list[Document], version: int) -> Manifest:
    """Fill the per-version fields of a manifest for a version holding exactly `docs`."""
    manifest.count = len(docs)
    manifest.corpus_hash = corpus_hash(docs)
    manifest.version = version
    manifest.created = utc_now()
    return manifest


def write_version(index_dir: Path, plan: VersionPlan, staged: Path | None = None,
                  keep: int = KEEP_VERSIONS) -> Manifest:
    """Stage, fsync and atomically publish a version (caller holds the writer lock). `staged`: a directory already
    holding the new segment's files (a merge writes them before it takes the lock)."""
    with (contextlib.nullcontext(staged) if staged is not None else staging_dir(index_dir)) as tmp:
        try:
            _stage_and_commit(index_dir, tmp, plan, keep)
        except (OSError, RuntimeError, sqlite3.Error) as exc:  # faiss and SQLite report a full disk in their own way
            if _disk_full(exc, index_dir):
                raise IndexDiskFullError(errno.ENOSPC, f"no space left for index version {plan.manifest.version} "
                                         f"in {index_dir}; the live version is unchanged: {exc}") from exc
            raise
    return plan.manifest


def _disk_full(exc: BaseException, index_dir: Path) -> bool:
    """ENOSPC/EDQUOT anywhere in the chain, or a write error while (almost) no space is left (checked before
    the staging directory is removed, which frees the space again)."""
    if any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in _chain(exc)):
        return True
    st = os.statvfs(index_dir)
    return st.f_bavail * st.f_frsize < _ALMOST_FULL_BYTES


_ALMOST_FULL_BYTES = 1 << 20


def _chain(exc: BaseException | None):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def _stage_and_commit(index_dir: Path, tmp: Path, plan: VersionPlan, keep: int) -> None:
    if plan.segment is not None:
        write_segment(tmp, plan.segment, plan.manifest)
    if len(plan.tombstones):
        with open(tmp / TOMBSTONES_FILE, "wb") as f:
            np.save(f, np.asarray(plan.tombstones, dtype=np.int64))
    for rel, src in plan.extra_files.items():
        link_or_copy(src, tmp / rel)
    write_manifest(tmp, plan.manifest)
    commit_version(index_dir, tmp, plan.manifest.version, keep=keep)


def write_segment(seg_dir: Path, seg: SegmentPlan, m: Manifest) -> None:
    """A segment's files: documents, vectors, its ANN structure, its BM25 postings (the caller fsyncs). An ANN
    segment of float32 vectors keeps them in faiss.index only (no second copy in embeddings.npy)."""
    write_docs(seg_dir / DOCS_FILE, seg.docs)
    in_faiss = seg.ann != "flat" and m.dtype == "float32"
    for name, rows in seg.arrays.items():
        if not (name is None and in_faiss):
            write_embeddings(store_path(seg_dir, name), rows.parts(), rows.shape, m.dtype)
    if seg.ann != "flat":
        vectors = np.concatenate(list(seg.arrays[None].parts())) if in_faiss else \
            open_embeddings(store_path(seg_dir, None))  # the stored (float16-rounded) rows: scores match embeddings()
        _write_faiss(seg_dir, np.asarray(vectors, dtype=np.float32), seg.ann, seg.faiss_params)
    if m.lexical:  # same documents, same segment: dense and lexical move together
        write_lexical(seg_dir, seg.docs, LexicalConfig.from_dict(m.lexical), seg.lexical_terms)


def _write_faiss(seg_dir: Path, vectors: np.ndarray, ann: str, params: dict) -> None:
    index = build_faiss(vectors, ann, params)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.make_direct_map()  # row -> (list, offset), saved with the index: embeddings() reads rows from it
    faiss.write_index(index, str(seg_dir / FAISS_FILE))
