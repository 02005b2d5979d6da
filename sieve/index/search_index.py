"""The read side: one loaded, immutable index version (its segments minus its tombstones), shared between threads.

Rows are the version's LIVE documents numbered 0..size-1 in segment order (index/segments.py); a search runs on
every segment (exactly on small ones, through their ANN structure on large ones) and merges the hits.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .corpus import Document
from .errors import IndexFormatError, UnknownDocumentError
from .layout import current_version_dir
from .lexical import Analyzer, LexicalConfig, LiveStats, bm25_scores, live_stats, top_positive
from .manifest import Manifest, check_manifest, read_manifest
from .protocol import Hits
from .segments import REGISTRY, SearchKnobs, Segment, local_tombstones, read_tombstones, segment_dir

_LOAD_ATTEMPTS = 3
SCORED_MAX_ROWS = 65_536  # search_scored keeps every row's score only up to this many rows (256 KB per query)


@dataclass
class _Parts:
    """The opened segments of one version and its live-row maps."""
    manifest: Manifest
    segments: list[Segment]
    offsets: np.ndarray                # (S+1,) physical row where each segment starts, then the total
    alive: np.ndarray | None           # (physical,) bool; None: nothing deleted
    seg_alive: list[np.ndarray | None]
    live_to_phys: np.ndarray | None    # (size,) ; None: the identity
    phys_to_live: np.ndarray | None    # (physical,) ; -1 for dead rows
    lexical: Analyzer | None = None
    lexical_stats: LiveStats | None = None


def _live_maps(m: Manifest, segments: list[Segment], tombstones: np.ndarray):
    offsets = np.cumsum([0, *(s.rows for s in segments)]).astype(np.int64)
    if not len(tombstones):
        return offsets, None, [None] * len(segments), None, None
    alive = np.ones(int(offsets[-1]), dtype=bool)
    for seg, start in zip(segments, offsets):
        alive[start + local_tombstones(tombstones, seg.name)] = False
    seg_alive = [alive[offsets[i]:offsets[i + 1]] for i in range(len(segments))]
    live_to_phys = np.flatnonzero(alive)
    phys_to_live = np.where(alive, np.cumsum(alive) - 1, -1)
    return offsets, alive, seg_alive, live_to_phys, phys_to_live


def _open_parts(vdir: Path, check: Callable[[Manifest], None], knobs: SearchKnobs) -> _Parts:
    m = read_manifest(vdir)
    check(m)  # before anything heavy is loaded
    if not m.segments:
        raise IndexFormatError(f"{vdir}/manifest.json lists no segments; rebuild with `sieve index build`")
    tombstones = read_tombstones(vdir)
    segments: list[Segment] = []
    try:
        for spec in m.segments:
            segments.append(REGISTRY.acquire(segment_dir(vdir.parent.parent, spec["name"]), spec, m, knobs))
        offsets, alive, seg_alive, l2p, p2l = _live_maps(m, segments, tombstones)
        live = int(offsets[-1]) - len(tombstones)
        if live != m.count:
            raise IndexFormatError(f"{vdir} holds {live} live rows, the manifest says {m.count}; "
                                   "rebuild with `sieve index build`")
    except Exception:
        for seg in segments:
            REGISTRY.release(seg)
        raise
    parts = _Parts(m, segments, offsets, alive, seg_alive, l2p, p2l)
    if m.lexical:
        parts.lexical = Analyzer(LexicalConfig.from_dict(m.lexical))
        parts.lexical_stats = live_stats([s.lexical for s in segments], alive, parts.lexical.config)
    return parts


class SearchIndex:
    """A loaded index version. Build with SearchIndex.load(). Implements index/protocol.py's IndexBackend: the
    pipeline's own first stages read it directly (returns_vectors = False: no vectors copied per hit)."""

    returns_vectors = False

    def __init__(self, index_dir: Path, parts: _Parts):
        self.index_dir = index_dir
        self.manifest = parts.manifest
        self.size = parts.manifest.count
        self.version = parts.manifest.version
        self.on_gpu = any(s.on_gpu for s in parts.segments)
        self._p = parts
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def load(cls, index_dir: str | Path, *, model_name: str | None = None,
             model_hash: str | None = None, dim: int | None = None, use_gpu: bool = False,
             nprobe: int = 16, ef_search: int = 128, flat_device: str | None = None,
             flat_cpu_dtype: str = "fp32") -> "SearchIndex":
        """Open the live version; checks the model identity for each field given. Segments this process already
        has open (an earlier version lists them too) are shared, not opened again. `flat_device`: a torch device
        ('cuda', 'cpu') whose memory holds every flat segment's vectors for exact search there (index/device_flat.py);
        `flat_cpu_dtype` 'bf16': on the CPU, a bfloat16 copy of them."""
        index_dir = Path(index_dir)
        if nprobe < 1 or ef_search < 1:
            raise ValueError(f"nprobe and ef_search must be >= 1, got {nprobe}, {ef_search}")

        def check(m: Manifest) -> None:
            check_manifest(m, model_name, model_hash, dim, index_dir=index_dir)

        for attempt in range(_LOAD_ATTEMPTS):
            vdir = current_version_dir(index_dir)
            try:
                knobs = SearchKnobs(use_gpu, nprobe, ef_search, flat_device, flat_cpu_dtype)
                return cls(index_dir, _open_parts(vdir, check, knobs))
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
        if len(arr) and (arr.min() < 0 or arr.max() >= self.size):
            bad = arr[(arr < 0) | (arr >= self.size)]
            raise ValueError(f"row(s) {bad[:10].tolist()} out of range; allowed rows are "
                             f"0..{self.size - 1}")
        return arr

    def _locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Live rows -> (segment index, local row)."""
        phys = rows if self._p.live_to_phys is None else self._p.live_to_phys[rows]
        seg = np.searchsorted(self._p.offsets, phys, side="right") - 1
        return seg, phys - self._p.offsets[seg]

    def _to_live(self, phys: np.ndarray) -> np.ndarray:
        return phys if self._p.phys_to_live is None else self._p.phys_to_live[phys]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: (scores float32, rows int64), both (B, min(k, size))."""
        q, k = self._checked_queries(queries, k)
        if len(q) == 0:
            return np.empty((0, k), np.float32), np.empty((0, k), np.int64)
        return self._search(q, k)

    def search_scored(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """search(), and every row's score ((B, size) float32) where the search computed them all anyway: one flat
        segment, nothing deleted, at most SCORED_MAX_ROWS rows, searched on the CPU by torch's matrix product (2 or
        more queries over the float32 map, any number over a bf16 copy: index/device_flat.py; Intel and AMD Zen 3
        and later CPUs, service/runtime.py). Else None, with search()'s top k. The first stage then reads its
        candidates' inner products there instead of their vectors."""
        q, k = self._checked_queries(queries, k)
        flat = self._p.segments[0].device_flat if len(self._p.segments) == 1 else None
        if flat is None or flat.device != "cpu" or (len(q) < 2 and not flat.takes_single_queries) \
                or self._p.live_to_phys is not None or self.size > SCORED_MAX_ROWS:
            scores, rows = self.search(q, k)
            return scores, rows, None
        return flat.search_scored(q, k, keep=True)  # the rows search() takes from the same product (tested)

    def _checked_queries(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, int]:
        self._check_open()
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.manifest.dim:
            raise ValueError(f"queries must have shape (B, {self.manifest.dim}), "
                             f"got {np.shape(queries)}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        return q, min(int(k), self.size)

    def _search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = self._search_segments(q, k, exact=False)
        short = (rows < 0).any(axis=1)
        if short.any():
            # IVF/HNSW can return fewer than k hits (-1); fill those queries exactly.
            scores[short], rows[short] = self._search_segments(q[short], k, exact=True)
        return scores, self._to_live(rows)

    def _search_segments(self, q: np.ndarray, k: int, exact: bool) -> tuple[np.ndarray, np.ndarray]:
        """Every segment's top-k merged: (scores, physical rows), (B, k), best first."""
        all_s, all_r = [], []
        for seg, start, alive in zip(self._p.segments, self._p.offsets, self._p.seg_alive):
            s, r = seg.search(q, k, alive, exact=exact)
            all_s.append(s)
            all_r.append(np.where(r >= 0, r + start, -1))
        scores, rows = np.concatenate(all_s, axis=1), np.concatenate(all_r, axis=1)
        if len(all_s) > 1:
            top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            scores, rows = np.take_along_axis(scores, top, axis=1), np.take_along_axis(rows, top, axis=1)
        return scores[:, :k].astype(np.float32, copy=True), rows[:, :k].copy()

    @property
    def has_lexical(self) -> bool:
        return self._p.lexical is not None

    def lexical_scores(self, query: str) -> np.ndarray:
        """BM25 score of every row for `query` over title + text (float32, (size,))."""
        self._check_open()
        if self._p.lexical is None:
            raise ValueError(f"the index at {self.index_dir} (version {self.version}) has no lexical part; "
                             "rebuild it with `sieve index build` (lexical is on by default)")
        phys = bm25_scores(self._p.lexical, [s.lexical for s in self._p.segments], self._p.offsets[:-1].tolist(),
                           self._p.lexical_stats, query)
        return phys if self._p.live_to_phys is None else phys[self._p.live_to_phys]

    def search_lexical(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows by BM25 (only rows sharing a term with the query): (scores, rows), 1-D, best first."""
        return top_positive(self.lexical_scores(query), max(1, min(int(k), self.size)))

    def lexical_scores_of(self, query: str, rows: Sequence[int]) -> np.ndarray:
        return self.lexical_scores(query)[self._rows(rows)]

    def dense_hits(self, vector: np.ndarray, k: int) -> Hits:
        scores, rows = self.search(np.asarray(vector, dtype=np.float32)[None, :], k)
        return Hits(rows[0], scores[0])

    def lexical_hits(self, query: str, k: int) -> Hits:
        scores, rows = self.search_lexical(query, k)
        return Hits(rows, scores)

    def both_hits(self, vector: np.ndarray, query: str, depth: int) -> tuple[Hits, Hits]:
        return self.dense_hits(vector, depth), self.lexical_hits(query, depth)

    def identity(self) -> str:
        """The version number and the hash of its documents: a number alone does not name the content (two
        servers sharing a result cache can each reach version 7 with different documents)."""
        return f"v{self.version}:{self.manifest.corpus_hash[:16]}"

    def check_ready(self) -> None:
        self._check_open()

    def ids(self, rows: Sequence[int]) -> list[str]:
        seg, local = self._locate(self._rows(rows))
        segments = self._p.segments
        return [segments[s].ids[r] for s, r in zip(seg.tolist(), local.tolist())]

    def _find(self, doc_id: str) -> int | None:
        """The live row of `doc_id`, or None. An id lives in at most one segment: the newest holding it."""
        for i in range(len(self._p.segments) - 1, -1, -1):
            local = self._p.segments[i].row_of.get(doc_id)
            if local is not None:
                alive = self._p.seg_alive[i]
                if alive is None or alive[local]:
                    return int(self._to_live(np.int64(self._p.offsets[i] + local)))
        return None

    def rows_for_ids(self, ids: Sequence[str]) -> list[int]:
        self._check_open()
        found = {i: self._find(i) for i in ids}
        unknown = [i for i in ids if found[i] is None]
        if unknown:
            raise UnknownDocumentError(list(dict.fromkeys(unknown)), size=self.size)
        return [found[i] for i in ids]

    def has_id(self, doc_id: str) -> bool:
        return self._find(doc_id) is not None

    def has_store(self, name: str) -> bool:
        return name in self.manifest.stores

    def embedding_dim(self, store: str | None = None) -> int:
        """The width of the primary store's vectors, or of an extra store's."""
        if store is not None and store not in self.manifest.stores:
            raise ValueError(f"unknown embedding store {store!r}; this index has "
                             f"{sorted(self.manifest.stores) or 'no extra stores'}")
        return self.manifest.dim if store is None else int(self.manifest.stores[store]["dim"])

    def embeddings(self, rows: Sequence[int], store: str | None = None) -> np.ndarray:
        """(n, dim) float32 copy of the given rows of the primary or an extra store."""
        arr = self._rows(rows)
        out = np.empty((len(arr), self.embedding_dim(store)), dtype=np.float32)
        self._gather(arr, out, store)
        return out

    def embeddings_into(self, rows: Sequence[int], out: np.ndarray, store: str | None = None) -> None:
        """embeddings(), written into `out` ((n, dim) float32, C-contiguous: a row block of a padded batch) instead
        of a new array: the CMC runner gathers each request's candidates straight into its batch
        (pipeline/packing.py)."""
        arr = self._rows(rows)
        if out.shape != (len(arr), self.embedding_dim(store)) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 of shape ({len(arr)}, {self.embedding_dim(store)}), "
                             f"got {out.dtype} {out.shape}")
        self._gather(arr, out, store)

    def _gather(self, arr: np.ndarray, out: np.ndarray, store: str | None) -> None:
        if len(self._p.segments) == 1 and self._p.live_to_phys is None:  # one segment, nothing deleted: rows are local
            source = self._p.segments[0].embeddings if store is None else self._p.segments[0].stores[store]
            if isinstance(source, np.ndarray) and source.dtype == np.float32:
                # one gather straight into out: rows are checked, and mode="raise" would gather into a buffer first
                np.take(np.asarray(source), arr, axis=0, out=out, mode="clip")
                return
        seg, local = self._locate(arr)
        for s in np.unique(seg).tolist():
            source = self._p.segments[s].embeddings if store is None else self._p.segments[s].stores[store]
            if isinstance(source, np.ndarray):
                source = np.asarray(source)  # a plain view of the memory map: no np.memmap per gather
            if len(self._p.segments) == 1:
                out[:] = source[local]
                break
            at = seg == s
            out[at] = source[local[at]]

    def documents(self, rows: Sequence[int]) -> list[Document]:
        """Documents for rows, in the order given, with one SQLite query per segment involved."""
        arr = self._rows(rows)
        seg, local = self._locate(arr)
        found: dict[tuple[int, int], tuple[str, str, str]] = {}
        with self._lock:
            self._check_open()
            for s in np.unique(seg).tolist():
                hits = self._p.segments[s].documents(local[seg == s].tolist())
                found.update({(s, r): v for r, v in hits.items()})
        return [Document(*found[(s, r)]) for s, r in zip(seg.tolist(), local.tolist())]

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                for seg in self._p.segments:
                    REGISTRY.release(seg)
