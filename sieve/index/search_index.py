"""The read side: one loaded, immutable index version, safe to share between threads."""
from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import faiss
import numpy as np

from .corpus import Document
from .errors import IndexFormatError, UnknownDocumentError
from .layout import current_version_dir
from .lexical import LexicalConfig, LexicalIndex, top_positive
from .manifest import Manifest, check_manifest, read_manifest
from .storage import DOCS_FILE, FAISS_FILE, connect_readonly, open_embeddings, row_chunks, store_path
from .vectors import exact_top_k, set_search_params, to_device

_LOAD_ATTEMPTS = 3


@dataclass
class _Parts:
    """The opened files of one version."""
    manifest: Manifest
    faiss_index: faiss.Index
    on_gpu: bool
    embeddings: np.ndarray
    stores: dict[str, np.ndarray]
    conn: sqlite3.Connection
    ids: list[str]
    lexical: LexicalIndex | None = None


def _check_shape(array: np.ndarray, shape: tuple[int, int], what: Path) -> None:
    if array.shape != shape:
        raise IndexFormatError(f"{what} has shape {array.shape}, the manifest says {shape}; "
                               "the index is damaged, rebuild with `sieve index build`")


def _read_ids(conn: sqlite3.Connection, count: int, path: Path) -> list[str]:
    rows = conn.execute("SELECT row, id FROM docs ORDER BY row").fetchall()
    if [r for r, _ in rows] != list(range(count)):
        raise IndexFormatError(f"{path} does not hold rows 0..{count - 1} as the manifest "
                               "says; the index is damaged, rebuild with `sieve index build`")
    return [i for _, i in rows]


def _open_parts(vdir: Path, check: Callable[[Manifest], None], use_gpu: bool,
                nprobe: int, ef_search: int) -> _Parts:
    m = read_manifest(vdir)
    check(m)  # before anything heavy is loaded
    emb = open_embeddings(store_path(vdir, None))
    _check_shape(emb, (m.count, m.dim), store_path(vdir, None))
    stores = {}
    for name, ident in m.stores.items():
        stores[name] = open_embeddings(store_path(vdir, name))
        _check_shape(stores[name], (m.count, int(ident["dim"])), store_path(vdir, name))
    index = faiss.read_index(str(vdir / FAISS_FILE))
    if index.ntotal != m.count:
        raise IndexFormatError(f"{vdir / FAISS_FILE} holds {index.ntotal} vectors, the "
                               f"manifest says {m.count}; rebuild with `sieve index build`")
    lexical = LexicalIndex(vdir, LexicalConfig.from_dict(m.lexical), m.count) if m.lexical else None
    set_search_params(index, nprobe, ef_search)
    device_index = to_device(index, use_gpu)
    on_gpu = device_index is not index
    conn = connect_readonly(vdir / DOCS_FILE)
    try:
        ids = _read_ids(conn, m.count, vdir / DOCS_FILE)
    except Exception:
        conn.close()
        raise
    return _Parts(m, device_index, on_gpu, emb, stores, conn, ids, lexical)


class SearchIndex:
    """A loaded index version. Build with SearchIndex.load()."""

    def __init__(self, index_dir: Path, parts: _Parts):
        self.index_dir = index_dir
        self.manifest = parts.manifest
        self.size = parts.manifest.count
        self.version = parts.manifest.version
        self.on_gpu = parts.on_gpu
        self._p = parts
        self._row_of = {doc_id: row for row, doc_id in enumerate(parts.ids)}
        self._db_lock = threading.Lock()
        # FAISS CPU indexes allow concurrent searches; GPU indexes do not.
        self._search_lock = threading.Lock() if parts.on_gpu else contextlib.nullcontext()
        self._closed = False

    @classmethod
    def load(cls, index_dir: str | Path, *, model_name: str | None = None,
             model_hash: str | None = None, dim: int | None = None, use_gpu: bool = False,
             nprobe: int = 16, ef_search: int = 128) -> "SearchIndex":
        """Open the live version; checks the model identity for each field given."""
        index_dir = Path(index_dir)

        def check(m: Manifest) -> None:
            check_manifest(m, model_name, model_hash, dim, index_dir=index_dir)

        for attempt in range(_LOAD_ATTEMPTS):
            vdir = current_version_dir(index_dir)
            try:
                return cls(index_dir, _open_parts(vdir, check, use_gpu, nprobe, ef_search))
            except Exception:
                # A writer may have pruned this version after we read CURRENT: retry
                # on the new one; anything else is a real error.
                if attempt + 1 == _LOAD_ATTEMPTS or current_version_dir(index_dir) == vdir:
                    raise
        raise AssertionError("unreachable")

    def __enter__(self) -> "SearchIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the SearchIndex for {self.index_dir} is closed")

    def _rows(self, rows: Sequence[int]) -> np.ndarray:
        self._check_open()
        arr = np.asarray(rows, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError(f"rows must be a flat sequence of ints, got shape {arr.shape}")
        bad = arr[(arr < 0) | (arr >= self.size)]
        if len(bad):
            raise ValueError(f"row(s) {bad[:10].tolist()} out of range; allowed rows are "
                             f"0..{self.size - 1}")
        return arr

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: (scores float32, rows int64), both (B, min(k, size))."""
        self._check_open()
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.manifest.dim:
            raise ValueError(f"queries must have shape (B, {self.manifest.dim}), "
                             f"got {np.shape(queries)}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        k = min(int(k), self.size)
        if len(q) == 0:
            return np.empty((0, k), np.float32), np.empty((0, k), np.int64)
        with self._search_lock:
            scores, rows = self._p.faiss_index.search(q, k)
        short = (rows < 0).any(axis=1)
        if short.any():
            # IVF/HNSW can return fewer than k hits (-1); fill those queries exactly.
            scores[short], rows[short] = exact_top_k(q[short], row_chunks(self._p.embeddings), k)
        return scores.astype(np.float32, copy=False), rows.astype(np.int64, copy=False)

    @property
    def has_lexical(self) -> bool:
        return self._p.lexical is not None

    def lexical_scores(self, query: str) -> np.ndarray:
        """BM25 score of every row for `query` over title + text (float32, (size,))."""
        self._check_open()
        if self._p.lexical is None:
            raise ValueError(f"the index at {self.index_dir} (version {self.version}) has no lexical part; "
                             "rebuild it with `sieve index build` (lexical is on by default)")
        return self._p.lexical.scores(query)

    def search_lexical(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows by BM25 (only rows sharing a term with the query): (scores, rows), 1-D, best first."""
        return top_positive(self.lexical_scores(query), max(1, min(int(k), self.size)))

    def ids(self, rows: Sequence[int]) -> list[str]:
        return [self._p.ids[r] for r in self._rows(rows).tolist()]

    def rows_for_ids(self, ids: Sequence[str]) -> list[int]:
        self._check_open()
        unknown = [i for i in ids if i not in self._row_of]
        if unknown:
            raise UnknownDocumentError(list(dict.fromkeys(unknown)), size=self.size)
        return [self._row_of[i] for i in ids]

    def has_id(self, doc_id: str) -> bool:
        return doc_id in self._row_of

    def has_store(self, name: str) -> bool:
        return name in self._p.stores

    def embeddings(self, rows: Sequence[int], store: str | None = None) -> np.ndarray:
        """(n, dim) float32 copy of the given rows of the primary or an extra store."""
        arr = self._rows(rows)
        if store is None:
            source = self._p.embeddings
        elif store in self._p.stores:
            source = self._p.stores[store]
        else:
            raise ValueError(f"unknown embedding store {store!r}; this index has "
                             f"{sorted(self._p.stores) or 'no extra stores'}")
        return np.array(source[arr], dtype=np.float32)

    def documents(self, rows: Sequence[int]) -> list[Document]:
        """Documents for rows, in the order given, with one SQLite query."""
        arr = self._rows(rows).tolist()
        with self._db_lock:
            self._check_open()
            found = self._p.conn.execute(
                "SELECT d.row, d.id, d.title, d.text FROM docs d WHERE d.row IN "
                "(SELECT value FROM json_each(?))", (json.dumps(arr),)).fetchall()
        by_row = {r: Document(i, t or "", x or "") for r, i, t, x in found}
        return [by_row[r] for r in arr]

    def close(self) -> None:
        with self._db_lock:
            if not self._closed:
                self._closed = True
                self._p.conn.close()
