"""Merges: fold a run of adjacent segments into one, dropping their deleted rows, without blocking readers or writers.

A merge reads a snapshot of the live version and writes the merged segment into versions/.merge-<random>/ WITHOUT
the writer lock (writes go on meanwhile); then it takes the lock for a moment, carries over the tombstones that
writes added to the merged segments since the snapshot, and publishes a new version that lists the merged segment
in the place of the run. Adjacent runs and the live order of rows inside them are kept, so no live document changes
its row and the corpus identity is unchanged. One merge at a time per index (a lock file; others skip).

`compact` merges everything (one segment, no tombstones: `sieve index compact`); `merge_if_due` applies the
MergePolicy after writes (few segments, bounded dead rows) and is what the service runs in the background.
"""
from __future__ import annotations

import contextlib
import fcntl
import secrets
import shutil
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .builder import _check_store_name
from .cache import encode_cached
from .corpus import Document
from .encoder import DocumentEncoder, encoder_identity
from .layout import KEEP_VERSIONS, live_version_number, version_name, versions_dir, writer_lock
from .manifest import Manifest, utc_now
from .segments import local_tombstones, new_segment_spec, segment_number, tombstone_keys
from .storage import row_chunks
from .vectors import segment_ann, segment_params
from .writer import LiveVersion, Rows, SegmentPlan, VersionPlan, write_segment, write_version

_LIVE_OPEN_ATTEMPTS = 3


@dataclass(frozen=True)
class MergePolicy:
    """When the service (and the CLI after a write) merges: SIEVE_INDEX_MAX_SEGMENTS, SIEVE_INDEX_MERGE_WIDTH,
    SIEVE_INDEX_COMPACT_DELETED_FRACTION."""
    max_segments: int = 10         # more than this: merge the `merge_width` adjacent segments holding the fewest rows
    merge_width: int = 5
    deleted_fraction: float = 0.2  # tombstones above this share of all rows: merge everything (full compaction)

    def run(self, m: Manifest) -> tuple[int, int] | None:
        n = len(m.segments)
        if m.deleted and m.deleted >= self.deleted_fraction * (m.count + m.deleted):
            return 0, n
        if n <= self.max_segments:
            return None
        width = max(2, min(self.merge_width, n))
        rows = [int(s["rows"]) for s in m.segments]
        start = min(range(n - width + 1), key=lambda i: sum(rows[i:i + width]))
        return start, start + width


@dataclass
class _Gathered:
    """The live rows of a run of segments, in order: documents, vector blocks, old local row -> merged row."""
    docs: list[Document]
    arrays: dict[str | None, Rows]
    maps: list[np.ndarray]  # per segment of the run: merged local row, -1 where the row was dead


def _gather(live: LiveVersion, specs: list[dict]) -> _Gathered:
    docs, maps, alive_rows = [], [], []
    for spec in specs:
        alive = np.ones(int(spec["rows"]), dtype=bool)
        alive[local_tombstones(live.tombstones, spec["name"])] = False
        seg_docs = live.docs(spec["name"])
        maps.append(np.where(alive, np.cumsum(alive) - 1 + len(docs), -1))
        docs += [d for d, a in zip(seg_docs, alive) if a]
        alive_rows.append(np.flatnonzero(alive))
    arrays = {}
    for store in [None, *live.manifest.stores]:
        dim = live.manifest.dim if store is None else int(live.manifest.stores[store]["dim"])

        def parts(store=store) -> Iterator[np.ndarray]:
            return chain.from_iterable(row_chunks(live.embeddings(s["name"], store), rows)
                                       for s, rows in zip(specs, alive_rows))
        arrays[store] = Rows((len(docs), dim), parts)
    return _Gathered(docs, arrays, maps)


@contextlib.contextmanager
def _merge_lock(index_dir: Path, wait: bool) -> Iterator[bool]:
    """One merge at a time per index (across processes); yields False when another one runs and `wait` is False."""
    index_dir.mkdir(parents=True, exist_ok=True)
    with open(index_dir / ".merge.lock", "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            for stale in versions_dir(index_dir).glob(".merge-*"):  # left by a killed merge: never listed
                shutil.rmtree(stale, ignore_errors=True)
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _snapshot(index_dir: Path) -> LiveVersion:
    for attempt in range(_LIVE_OPEN_ATTEMPTS):
        try:
            return LiveVersion.open(index_dir)
        except FileNotFoundError:  # pruned between reading CURRENT and the manifest: read the new one
            if attempt + 1 == _LIVE_OPEN_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def merge(index_dir: str | Path, pick: Callable[[Manifest], tuple[int, int] | None],
          wait: bool = False) -> Manifest | None:
    """Merge the run of segments `pick` chooses from the live manifest; None if nothing was due, or another merge
    runs (and `wait` is False)."""
    index_dir = Path(index_dir)
    with _merge_lock(index_dir, wait) as mine:
        if not mine:
            return None
        snap = _snapshot(index_dir)
        run = pick(snap.manifest)
        if run is None:
            return None
        specs = snap.manifest.segments[run[0]:run[1]]
        whole = run == (0, len(snap.manifest.segments))
        got = _gather(snap, specs)
        m = snap.manifest
        ann = segment_ann(m.faiss_kind, m.faiss_params, len(got.docs), whole=whole)
        staged = versions_dir(index_dir) / f".merge-{secrets.token_hex(8)}"
        staged.mkdir()
        try:
            write_segment(staged, SegmentPlan(got.docs, got.arrays, ann,
                                              segment_params(m.faiss_kind, m.faiss_params, len(got.docs))), m)
            with writer_lock(index_dir):
                return _publish(index_dir, staged, specs, got, ann, whole)
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # gone already when it was published


def _publish(index_dir: Path, staged: Path, specs: list[dict], got: _Gathered, ann: str,
             whole: bool) -> Manifest | None:
    live = LiveVersion.open(index_dir)
    names = [s["name"] for s in live.manifest.segments]
    run = [s["name"] for s in specs]
    at = next((i for i in range(len(names)) if names[i:i + len(run)] == run), None)
    if at is None:
        return None
    version = live_version_number(index_dir) + 1
    name = version_name(version)
    in_run = np.isin(live.tombstones >> 32, [segment_number(n) for n in run])
    carried = []  # rows deleted since the snapshot, now rows of the merged segment (-1: dead already, dropped)
    for spec, mapping in zip(specs, got.maps):
        merged = mapping[local_tombstones(live.tombstones, spec["name"])]
        carried.append(tombstone_keys(name, merged[merged >= 0]))
    tombstones = np.union1d(live.tombstones[~in_run], np.concatenate([np.empty(0, np.int64), *carried]))
    segments = [*live.manifest.segments[:at], new_segment_spec(name, len(got.docs), ann),
                *live.manifest.segments[at + len(run):]]
    m = replace(live.manifest, version=version, created=utc_now(), segments=segments, deleted=int(len(tombstones)))
    # a whole compaction frees the old segments at once (readers that hold them keep their open files)
    return write_version(index_dir, VersionPlan(m, None, tombstones.astype(np.int64)), staged=staged,
                         keep=1 if whole and live.manifest.segments == specs else KEEP_VERSIONS)


def compact(index_dir: str | Path) -> Manifest | None:
    """Merge every segment into one and drop every deleted row (waiting for a running merge first); None when the
    index is one segment without deleted rows already."""
    return merge(index_dir, lambda m: (0, len(m.segments)) if len(m.segments) > 1 or m.deleted else None, wait=True)


def merge_if_due(index_dir: str | Path, policy: MergePolicy = MergePolicy()) -> Manifest | None:
    return merge(index_dir, policy.run)


def add_store(index_dir: str | Path, name: str, encoder: DocumentEncoder,
              cache_dir: Path | None = None, progress: bool = True) -> Manifest:
    """Add (or replace) an extra embedding store covering every current document: one merged segment (O(N), offline)."""
    _check_store_name(name)
    index_dir = Path(index_dir)
    with writer_lock(index_dir):
        live = LiveVersion.open(index_dir)
        stores = {**live.manifest.stores, name: encoder_identity(encoder)}
        kept = replace(live.manifest, stores={k: v for k, v in live.manifest.stores.items() if k != name})
        got = _gather(replace(live, manifest=kept), live.manifest.segments)
        emb = encode_cached(encoder, [d.full_text for d in got.docs], cache_dir, progress)
        got.arrays[name] = Rows(emb.shape, lambda: [emb])
        version = live_version_number(index_dir) + 1
        m = replace(live.manifest, stores=stores, version=version, created=utc_now(), deleted=0)
        ann = segment_ann(m.faiss_kind, m.faiss_params, len(got.docs), whole=True)
        m.segments = [new_segment_spec(version_name(version), len(got.docs), ann)]
        seg = SegmentPlan(got.docs, got.arrays, ann, segment_params(m.faiss_kind, m.faiss_params, len(got.docs)))
        return write_version(index_dir, VersionPlan(m, seg))

