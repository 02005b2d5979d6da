"""Segments: the immutable parts a version is made of, and the tombstones that hide deleted rows.

A version (DIR/versions/vNNNNNN/manifest.json) lists its segments, oldest first. A segment is the set of files one
write (or a build, or a merge) produced, kept in the directory of the version that produced it:

    embeddings.npy, stores/NAME.npy   the vectors (memory-mapped; exact search runs on them directly)
    faiss.index                       an ANN structure (IVF or HNSW), only when the segment is large enough; it
                                      holds the float32 vectors itself, so such a segment has no embeddings.npy
                                      (one copy on disk and in memory, read through the index: FaissRows)
    docs.sqlite                       ids, titles, texts by local row
    bm25/                             term frequencies for BM25 (index/lexical.py)

A later version refers to an earlier segment by name, so a write costs what it holds, not what the index holds.
Rows are numbered across the segments in order (physical rows); deleted rows are listed in the version's
deleted.npy as keys (segment number << 32 | local row). The read side numbers LIVE rows 0..count-1 in physical
order, so a merge (which keeps that order) never renumbers a document.

Opened segments are shared: every loaded version in this process that lists a segment uses one open copy
(SegmentRegistry), so a reload opens only the segments it has not seen, and memory-mapped files are shared with
every other process reading the same index (the page cache).
"""
from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from .errors import IndexFormatError
from .layout import versions_dir
from .lexical import LexicalSegment
from .manifest import Manifest
from .storage import DOCS_FILE, FAISS_FILE, connect_readonly, open_embeddings, row_chunks, store_path
from .device_flat import DeviceFlat
from .vectors import exact_top_k, to_device

TOMBSTONES_FILE = "deleted.npy"
# The largest bf16 copy of one flat segment's vectors a CPU server makes (each worker holds its own, in RAM): 256 MiB,
# e.g. 349,525 x 384; a larger flat segment (`sieve index build --faiss flat`) is searched over its float32 map.
BF16_COPY_MAX_BYTES = 256 << 20
_ROW_BITS = 32


def segment_number(name: str) -> int:
    return int(name.lstrip("v"))


def tombstone_keys(segment: str, local_rows: np.ndarray) -> np.ndarray:
    return (np.int64(segment_number(segment)) << _ROW_BITS) | np.asarray(local_rows, dtype=np.int64)


def read_tombstones(version_dir: Path) -> np.ndarray:
    """Sorted tombstone keys of a version (empty when it deletes nothing)."""
    path = version_dir / TOMBSTONES_FILE
    return np.load(path) if path.exists() else np.empty(0, np.int64)


def local_tombstones(keys: np.ndarray, segment: str) -> np.ndarray:
    """Local rows of `segment` that `keys` delete."""
    number = np.int64(segment_number(segment))
    return (keys[(keys >> _ROW_BITS) == number] & ((1 << _ROW_BITS) - 1)).astype(np.int64)


def segment_dir(index_dir: Path, name: str) -> Path:
    return versions_dir(index_dir) / name


def _check_shape(array: np.ndarray, shape: tuple[int, int], what: Path) -> None:
    if array.shape != shape:
        raise IndexFormatError(f"{what} has shape {array.shape}, the manifest says {shape}; "
                               "the index is damaged, rebuild with `sieve index build`")


def _read_ids(conn: sqlite3.Connection, count: int, path: Path) -> list[str]:
    rows = conn.execute("SELECT row, id FROM docs ORDER BY row").fetchall()
    if len(rows) != count or (rows and (rows[0][0], rows[-1][0]) != (0, count - 1)):
        raise IndexFormatError(f"{path} does not hold rows 0..{count - 1} as the manifest "
                               "says; the index is damaged, rebuild with `sieve index build`")
    return [i for _, i in rows]


class FaissRows:
    """The vectors stored inside a FAISS index, read like a (rows, dim) float32 array (IVF: via its direct map)."""

    def __init__(self, index: faiss.Index):
        self.index = index
        self.shape = (int(index.ntotal), int(index.d))
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        ids = np.arange(self.shape[0], dtype=np.int64)[rows] if isinstance(rows, slice) else \
            np.asarray(rows, dtype=np.int64)
        if ids.ndim == 0:
            return self.index.reconstruct(int(ids))
        if len(ids) == 0:
            return np.empty((0, self.shape[1]), np.float32)
        return self.index.reconstruct_batch(ids)


def read_faiss(path: Path) -> faiss.Index:
    # IO_FLAG_MMAP_IFC maps the codes and inverted lists from the file instead of copying them: every version
    # and every process that opens this segment shares one copy in the page cache.
    return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)


def open_vectors(seg_path: Path, store: str | None) -> np.ndarray | FaissRows:
    """A segment's vectors of one store: the memory-mapped .npy, or (primary of an ANN segment) the FAISS index."""
    path = store_path(seg_path, store)
    if store is None and not path.exists() and (seg_path / FAISS_FILE).exists():
        return FaissRows(read_faiss(seg_path / FAISS_FILE))
    return open_embeddings(path)


@dataclass(frozen=True)
class SearchKnobs:
    use_gpu: bool = False
    nprobe: int = 16
    ef_search: int = 128
    flat_device: str | None = None  # exact search of flat segments on this torch device (index/device_flat.py)
    flat_cpu_dtype: str = "fp32"  # 'bf16': on the CPU, a bfloat16 copy of flat segments' vectors is searched


class Segment:
    """One opened segment: read-only, thread-safe, shared by every loaded version that lists it."""

    def __init__(self, path: Path, spec: dict[str, Any], m: Manifest, knobs: SearchKnobs):
        self.path, self.name, self.rows, self.ann = path, spec["name"], int(spec["rows"]), spec.get("ann", "flat")
        self.knobs = knobs
        self.embeddings = open_vectors(path, None)
        _check_shape(self.embeddings, (self.rows, m.dim), store_path(path, None))
        self.stores = {}
        for name, ident in m.stores.items():
            self.stores[name] = open_embeddings(store_path(path, name))
            _check_shape(self.stores[name], (self.rows, int(ident["dim"])), store_path(path, name))
        self.faiss, self.on_gpu = None, False
        if self.ann != "flat":
            self.faiss = self._read_faiss(path / FAISS_FILE, knobs)
        self.device_flat = None
        cpu_dtype = knobs.flat_cpu_dtype if self.rows * m.dim * 2 <= BF16_COPY_MAX_BYTES else "fp32"
        if self.ann == "flat" and knobs.flat_device and not isinstance(self.embeddings, FaissRows) \
                and (knobs.flat_device != "cpu" or cpu_dtype == "bf16" or self.embeddings.dtype == np.float32):
            # on the CPU a float32 map, searched where it lies, or a bf16 copy; a float16 map would need a float32
            # copy in RAM
            self.device_flat = DeviceFlat(self.embeddings, knobs.flat_device, knobs.use_gpu, cpu_dtype)
        self.lexical = LexicalSegment(path, self.rows) if m.lexical else None
        self.conn = connect_readonly(path / DOCS_FILE)
        try:
            self.ids = _read_ids(self.conn, self.rows, path / DOCS_FILE)
        except Exception:
            self.conn.close()
            raise
        self.row_of = {doc_id: row for row, doc_id in enumerate(self.ids)}
        self.db_lock = threading.Lock()
        self.search_lock = threading.Lock()  # FAISS GPU indexes do not allow concurrent searches

    def _read_faiss(self, path: Path, knobs: SearchKnobs):
        index = self.embeddings.index if isinstance(self.embeddings, FaissRows) else read_faiss(path)
        if index.ntotal != self.rows:
            raise IndexFormatError(f"{path} holds {index.ntotal} vectors, the manifest says {self.rows}; "
                                   "rebuild with `sieve index build`")
        device_index = to_device(index, knobs.use_gpu)
        self.on_gpu = device_index is not index
        return device_index

    def search(self, q: np.ndarray, k: int, alive: np.ndarray | None, exact: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k live local rows: (scores (B, k) float32 padded with -inf, rows (B, k) int64 padded with -1)."""
        dead = 0 if alive is None else int(self.rows - alive.sum())
        if self.faiss is not None and not exact:
            scores, rows = self._search_ann(q, k, alive, dead)
        else:
            scores, rows = self._search_exact(q, min(self.rows, k + dead))
        return _keep_alive(scores, rows, alive, k)

    def _search_exact(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.device_flat is not None and (len(q) > 1 or self.device_flat.takes_single_queries):
            # the vectors on the serving device: one matmul + top-k there (over the CPU's float32 map from 2 queries:
            # one query alone costs torch 1.1x FAISS's own kernel, a batch 0.5-0.75x; benchmarks/dense_batch.py)
            return self.device_flat.search(q, k)
        if isinstance(self.embeddings, FaissRows):
            ivf = faiss.try_extract_index_ivf(self.embeddings.index)
            if ivf is not None:  # every list probed: exact
                return self.embeddings.index.search(q, k, params=faiss.SearchParametersIVF(nprobe=ivf.nlist))
        elif self.embeddings.dtype == np.float32:  # FAISS's brute force straight on the memory map: no copy
            return faiss.knn(q, self.embeddings, k, metric=faiss.METRIC_INNER_PRODUCT)
        return exact_top_k(q, row_chunks(self.embeddings), k)

    def _search_ann(self, q: np.ndarray, k: int, alive: np.ndarray | None, dead: int):
        k = min(k, self.rows)
        if self.on_gpu:  # GPU indexes take no selector: ask for enough to drop the dead ones afterwards
            with self.search_lock:
                return self.faiss.search(q, min(self.rows, k + dead))
        bits = None if alive is None else np.packbits(alive, bitorder="little")  # read during the search: keep it
        selector = None if bits is None else faiss.IDSelectorBitmap(self.rows, faiss.swig_ptr(bits))
        if isinstance(self.faiss, faiss.IndexHNSW):
            params = faiss.SearchParametersHNSW(efSearch=max(self.knobs.ef_search, k), sel=selector)
        else:
            ivf = faiss.extract_index_ivf(self.faiss)
            params = faiss.SearchParametersIVF(nprobe=min(self.knobs.nprobe, ivf.nlist), sel=selector)
        return self.faiss.search(q, k, params=params)

    def documents(self, local_rows: list[int]) -> dict[int, tuple[str, str, str]]:
        import json

        with self.db_lock:
            found = self.conn.execute("SELECT row, id, title, text FROM docs WHERE row IN "
                                      "(SELECT value FROM json_each(?))", (json.dumps(local_rows),)).fetchall()
        return {r: (i, t or "", x or "") for r, i, t, x in found}

    def close(self) -> None:
        with self.db_lock:
            self.conn.close()


def _keep_alive(scores: np.ndarray, rows: np.ndarray, alive: np.ndarray | None, k: int):
    """Drop dead and missing (-1) hits, keep the first k of each query, pad with (-inf, -1)."""
    rows = rows.astype(np.int64, copy=False)
    ok = rows >= 0
    if alive is not None:
        ok &= alive[np.maximum(rows, 0)]
    if ok.all() and rows.shape[1] <= k:
        return scores.astype(np.float32, copy=False), rows
    order = np.argsort(~ok, axis=1, kind="stable")[:, :k]  # live hits first, in their ranked order
    out_s = np.take_along_axis(np.where(ok, scores, -np.inf), order, axis=1).astype(np.float32)
    out_r = np.take_along_axis(np.where(ok, rows, -1), order, axis=1)
    return out_s, out_r


class SegmentRegistry:
    """Open segments by directory, counted by the versions using them: a reload opens only new segments."""

    def __init__(self):
        self.lock = threading.Lock()
        self.open: dict[tuple, list] = {}  # key -> [Segment, users]

    @staticmethod
    def key(path: Path, knobs: SearchKnobs) -> tuple:
        st = path.stat()  # a directory re-created under the same name (a rebuilt, never-live version) is new
        return (str(path.resolve()), st.st_ino, st.st_ctime_ns, knobs)

    def acquire(self, path: Path, spec: dict, m: Manifest, knobs: SearchKnobs) -> Segment:
        key = self.key(path, knobs)
        with self.lock:
            entry = self.open.get(key)
            if entry is not None and entry[0].rows == int(spec["rows"]):
                entry[1] += 1
                return entry[0]
        segment = Segment(path, spec, m, knobs)  # opened outside the lock: it can take a while
        with self.lock:
            entry = self.open.setdefault(key, [segment, 0])
            entry[1] += 1
        if entry[0] is not segment:
            segment.close()
        return entry[0]

    def release(self, segment: Segment) -> None:
        with self.lock:
            for key, entry in list(self.open.items()):
                if entry[0] is segment:
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self.open[key]
                        segment.close()
                    return


REGISTRY = SegmentRegistry()  # process-wide: what makes two loaded versions share their unchanged segments


def new_segment_spec(name: str, rows: int, ann: str) -> dict[str, Any]:
    return {"name": name, "rows": int(rows), "ann": ann}

