"""Upserts and deletes applied together as ONE new version that costs what the write holds: a new segment with the
upserted documents, tombstones for the deleted and the replaced rows, and a manifest listing the earlier segments
by name. Nothing already on disk is read beyond an indexed id lookup per segment and the tombstone list."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from .builder import PRIMARY, check_encoders, check_unique_ids
from .corpus import Document
from .encoder import DocumentEncoder, checked_embeddings
from .errors import UnknownDocumentError
from .layout import live_version_number, version_name, writer_lock
from .manifest import Manifest, utc_now
from .segments import new_segment_spec, tombstone_keys
from .vectors import segment_ann, segment_params
from .writer import LiveVersion, Rows, SegmentPlan, VersionPlan, chained_hash, write_version


def _delta(live: LiveVersion, upserts: list[Document], encoders: dict[str, DocumentEncoder]) -> SegmentPlan:
    texts = [d.full_text for d in upserts]
    arrays = {}
    for name, encoder in encoders.items():
        new = checked_embeddings(encoder, texts, False)
        arrays[None if name == PRIMARY else name] = Rows(new.shape, lambda n=new: [n])
    m = live.manifest
    ann = segment_ann(m.faiss_kind, m.faiss_params, len(upserts), whole=False)
    return SegmentPlan(upserts, arrays, ann, segment_params(m.faiss_kind, m.faiss_params, len(upserts)))


def apply_changes(index_dir: str | Path, upserts: Sequence[Document], delete_ids: Sequence[str],
                  encoders: dict[str, DocumentEncoder]) -> Manifest:
    """Delete `delete_ids`, then add or replace `upserts`, in one version. An unknown delete id changes nothing
    (UnknownDocumentError). A replaced document moves to the new segment (it gets the next live row)."""
    upserts, index_dir = list(upserts), Path(index_dir)
    if upserts:
        check_unique_ids(upserts, "documents to add")
    with writer_lock(index_dir):
        live = LiveVersion.open(index_dir)
        if upserts:
            check_encoders(live.manifest, encoders, index_dir)
        found = live.find([*delete_ids, *(d.id for d in upserts)])
        unknown = sorted({i for i in delete_ids if i not in found})
        if unknown:
            raise UnknownDocumentError(unknown, size=live.manifest.count)
        removed = {i: found[i] for i in {*delete_ids, *(d.id for d in upserts)} if i in found}
        count = live.manifest.count - len(removed) + len(upserts)
        if count < 1:
            raise ValueError("cannot delete every document; an index must hold at least one "
                             "(build a new index instead)")
        version = live_version_number(index_dir) + 1
        keys = [tombstone_keys(seg, np.array([row])) for seg, row in removed.values()]
        tombstones = np.union1d(live.tombstones, np.concatenate(keys) if keys else np.empty(0, np.int64))
        segment = _delta(live, upserts, encoders) if upserts else None
        specs = list(live.manifest.segments)
        if segment is not None:
            specs.append(new_segment_spec(version_name(version), len(upserts), segment.ann))
        m = replace(live.manifest, count=count, version=version, created=utc_now(), segments=specs,
                    deleted=int(len(tombstones)),
                    corpus_hash=chained_hash(live.manifest.corpus_hash, upserts, removed))
        return write_version(index_dir, VersionPlan(m, segment, tombstones.astype(np.int64)))


def add_documents(index_dir: str | Path, docs: Sequence[Document],
                  encoders: dict[str, DocumentEncoder], progress: bool = False) -> Manifest:
    """Add documents; an existing id is replaced (its new version gets the next live row)."""
    docs = list(docs)
    check_unique_ids(docs, "documents to add")
    if PRIMARY not in encoders:
        raise ValueError(f"encoders[{PRIMARY!r}] is required to add documents")
    return apply_changes(index_dir, docs, [], encoders)


def delete_documents(index_dir: str | Path, ids: Sequence[str]) -> Manifest:
    """Delete documents by id; if any id is unknown nothing is changed."""
    return apply_changes(index_dir, [], list(dict.fromkeys(ids)), {})
