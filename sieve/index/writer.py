"""Writing one complete index version: the step shared by build, add, delete, add_store."""
from __future__ import annotations

import errno
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import faiss
import numpy as np

from .corpus import Document, corpus_hash
from .errors import IndexDiskFullError
from .layout import commit_version, current_version_dir, staging_dir
from .lexical import LEXICAL_DIR, LexicalConfig, write_lexical
from .manifest import Manifest, read_manifest, utc_now, write_manifest
from .storage import (DOCS_FILE, FAISS_FILE, link_or_copy, open_embeddings, read_all_docs,
                      store_path, write_docs, write_embeddings)
from .vectors import build_faiss


@dataclass
class Rows:
    """Embedding rows for one store of the new version, produced lazily in blocks."""
    shape: tuple[int, int]
    parts: Callable[[], Iterable[np.ndarray]]


@dataclass
class VersionPlan:
    """Everything a new version holds; files not listed are hard-linked from `reuse`."""
    manifest: Manifest
    docs: list[Document] | None = None                 # None: reuse docs.sqlite
    arrays: dict[str | None, Rows] = field(default_factory=dict)  # None key: primary
    reuse: dict[str, Path] = field(default_factory=dict)          # relative path -> source


@dataclass
class LiveVersion:
    """The version a modification starts from (read under the writer lock)."""
    path: Path
    manifest: Manifest

    @classmethod
    def open(cls, index_dir: Path) -> "LiveVersion":
        path = current_version_dir(index_dir)
        return cls(path, read_manifest(path))

    def docs(self) -> list[Document]:
        return read_all_docs(self.path / DOCS_FILE)

    def embeddings(self, store: str | None = None) -> np.ndarray:
        return open_embeddings(store_path(self.path, store))

    def lexical_files(self) -> dict[str, Path]:
        """The lexical part's files, relative path -> source, for a version that keeps the same documents."""
        root = self.path / LEXICAL_DIR
        return {str(p.relative_to(self.path)): p for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}


def finish_manifest(manifest: Manifest, docs: list[Document], version: int) -> Manifest:
    """Fill the per-version fields of a manifest for the documents being written."""
    manifest.count = len(docs)
    manifest.corpus_hash = corpus_hash(docs)
    manifest.version = version
    manifest.created = utc_now()
    return manifest


def write_version(index_dir: Path, plan: VersionPlan) -> Manifest:
    """Stage, fsync and atomically publish a version (caller holds the writer lock)."""
    with staging_dir(index_dir) as tmp:
        try:
            _stage_and_commit(index_dir, tmp, plan)
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


def _stage_and_commit(index_dir: Path, tmp: Path, plan: VersionPlan) -> None:
    m = plan.manifest
    if plan.docs is not None:
        write_docs(tmp / DOCS_FILE, plan.docs)
    for name, rows in plan.arrays.items():
        write_embeddings(store_path(tmp, name), rows.parts(), rows.shape, m.dtype)
    for rel, src in plan.reuse.items():
        link_or_copy(src, tmp / rel)
    if FAISS_FILE not in plan.reuse:
        _write_faiss(tmp, m)
    if m.lexical and plan.docs is not None:  # same documents, same version: dense and lexical move together
        write_lexical(tmp, plan.docs, LexicalConfig.from_dict(m.lexical))
    write_manifest(tmp, m)
    commit_version(index_dir, tmp, m.version)


def _write_faiss(version_dir: Path, m: Manifest) -> None:
    # Built from the stored (possibly float16-rounded) rows so every rebuild
    # of the same data gives the same index, and scores match embeddings().
    emb = np.asarray(open_embeddings(store_path(version_dir, None)), dtype=np.float32)
    index = build_faiss(emb, m.faiss_kind, m.faiss_params)
    faiss.write_index(index, str(version_dir / FAISS_FILE))
