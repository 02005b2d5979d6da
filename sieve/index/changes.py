"""Upserts and deletes applied together as ONE new version (the live service groups concurrent writes into one
call: a version costs O(N) to write, so N writes arriving together cost one rewrite, not N)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .builder import PRIMARY, _check_encoders, _check_unique_ids, _Merge
from .corpus import Document
from .encoder import DocumentEncoder, checked_embeddings
from .errors import UnknownDocumentError
from .layout import live_version_number, writer_lock
from .manifest import Manifest
from .storage import row_chunks
from .writer import LiveVersion, Rows, VersionPlan, finish_manifest, write_version


def _kept_then_merged(old: np.ndarray, keep: np.ndarray, merge: _Merge, new: np.ndarray) -> Iterator[np.ndarray]:
    """Blocks of old[keep] with replaced rows patched in, then the appended rows."""
    start = 0
    for block in row_chunks(old, keep):
        block = np.array(block, dtype=np.float32)
        sel = (merge.replace_rows >= start) & (merge.replace_rows < start + len(block))
        block[merge.replace_rows[sel] - start] = new[merge.replace_src[sel]]
        start += len(block)
        yield block
    yield new[merge.appended]


def apply_changes(index_dir: str | Path, upserts: Sequence[Document], delete_ids: Sequence[str],
                  encoders: dict[str, DocumentEncoder]) -> Manifest:
    """Delete `delete_ids`, then add or replace `upserts`, in one version. Unknown delete ids change nothing."""
    upserts, index_dir = list(upserts), Path(index_dir)
    if upserts:
        _check_unique_ids(upserts, "documents to add")
    with writer_lock(index_dir):
        live = LiveVersion.open(index_dir)
        _check_encoders(live.manifest, encoders, index_dir)
        docs = live.docs()
        gone = set(delete_ids)
        unknown = sorted(gone - {d.id for d in docs})
        if unknown:
            raise UnknownDocumentError(unknown, size=len(docs))
        keep = np.array([r for r, d in enumerate(docs) if d.id not in gone], dtype=np.int64)
        merge = _Merge.plan([docs[r] for r in keep], upserts)
        if not merge.docs:
            raise ValueError("cannot delete every document; an index must hold at least one")
        texts = [d.full_text for d in upserts]
        arrays = {}
        for name, encoder in encoders.items():
            store = None if name == PRIMARY else name
            new = checked_embeddings(encoder, texts, False) if texts else np.empty((0, encoder.dim), np.float32)
            old = live.embeddings(store)
            arrays[store] = Rows((len(merge.docs), old.shape[1]),
                                 lambda o=old, n=new: _kept_then_merged(o, keep, merge, n))
        m = finish_manifest(replace(live.manifest), merge.docs, live_version_number(index_dir) + 1)
        return write_version(index_dir, VersionPlan(m, merge.docs, arrays))
