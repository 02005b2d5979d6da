"""Build an index: one segment holding every document (writes: changes.py; merges and stores: compaction.py)."""
from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

from .cache import encode_cached
from .corpus import Document
from .encoder import DocumentEncoder, encoder_identity
from .errors import IndexMismatchError
from .lexical import LexicalConfig, TokenizingInParallel
from .layout import rebuild_version_number, version_name, writer_lock
from .manifest import DTYPES, FORMAT_VERSION, Manifest, check_manifest
from .segments import new_segment_spec
from .vectors import resolve_params, segment_ann, segment_params
from .writer import Rows, SegmentPlan, VersionPlan, finish_manifest, write_version

PRIMARY = "primary"
_STORE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def check_unique_ids(docs: Sequence[Document], what: str) -> None:
    if not docs:
        raise ValueError(f"{what} is empty; at least one document is required")
    dups = [i for i, n in Counter(d.id for d in docs).items() if n > 1]
    if dups:
        shown = ", ".join(repr(i) for i in dups[:10])
        raise ValueError(f"{what} has {len(dups)} duplicate document id(s): {shown}; "
                         "ids must be unique")


def _check_store_name(name: str) -> None:
    if name == PRIMARY or not _STORE_NAME_RE.match(name):
        raise ValueError(f"invalid store name {name!r}; use letters, digits, '_', '-', '.' "
                         f"(max 64 chars, not starting with '.' or '-'), not {PRIMARY!r}")


def _in_memory(array: np.ndarray) -> Rows:
    return Rows(array.shape, lambda: [array])


def _validate_build(docs: list[Document], dtype: str, faiss_kind: str,
                    faiss_params: dict | None, store_names: Sequence[str],
                    lexical: LexicalConfig | None = None) -> dict:
    """Check every cheap option before encoding, which can take minutes; return faiss params."""
    check_unique_ids(docs, "corpus")
    if lexical is not None:
        lexical.check()
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    for name in store_names:
        _check_store_name(name)
    return resolve_params(faiss_kind, faiss_params, len(docs))


def build_index(docs: Sequence[Document], encoder: DocumentEncoder, out_dir: str | Path, *,
                dtype: str = "float32", faiss_kind: str = "auto",
                faiss_params: dict | None = None, cache_dir: Path | None = None,
                progress: bool = True,
                extra_stores: dict[str, DocumentEncoder] | None = None,
                lexical: LexicalConfig | None = LexicalConfig(), lexical_processes: int = 1,
                timings: dict[str, float] | None = None) -> Manifest:
    """Encode `docs` and publish them as a new version of the index at `out_dir`, with a BM25 part unless
    `lexical` is None. `lexical_processes` > 1: the BM25 part is tokenized in that many processes while the
    documents are encoded (lexical.build_processes; the program's main module must be guarded, as for any
    multiprocessing); 1: in this process, after the encoding. `timings`, when given, gets the seconds of each part:
    `encode` (every store's encoder, or its cache), `lexical_wait` (waiting for those processes after it) and
    `write` (the segment, BM25 included when tokenized here, FAISS, fsync, publishing)."""
    docs, out_dir, extra_stores = list(docs), Path(out_dir), dict(extra_stores or {})
    params = _validate_build(docs, dtype, faiss_kind, faiss_params, list(extra_stores), lexical)
    texts = [d.full_text for d in docs]
    timings = {} if timings is None else timings
    tokenizing = TokenizingInParallel(texts, lexical, lexical_processes) \
        if lexical is not None and lexical_processes > 1 and docs else None
    try:
        started = time.perf_counter()
        arrays = {None: _in_memory(encode_cached(encoder, texts, cache_dir, progress))}
        for name, enc in extra_stores.items():
            arrays[name] = _in_memory(encode_cached(enc, texts, cache_dir, progress))
        timings["encode"] = time.perf_counter() - started
        terms = tokenizing.result() if tokenizing is not None else None
        timings["lexical_wait"] = time.perf_counter() - started - timings["encode"]
    finally:
        if tokenizing is not None:
            tokenizing.shutdown()
    manifest = Manifest(
        format_version=FORMAT_VERSION, model_name=encoder.name,
        model_hash=encoder.weights_hash, dim=int(encoder.dim), count=0, dtype=dtype,
        faiss_kind=faiss_kind, faiss_params=params, corpus_hash="", created="", version=0,
        stores={n: encoder_identity(e) for n, e in extra_stores.items()},
        lexical=lexical.to_dict() if lexical is not None else {})
    ann = segment_ann(faiss_kind, params, len(docs), whole=True)
    segment = SegmentPlan(docs, arrays, ann, segment_params(faiss_kind, params, len(docs)), terms)
    started = time.perf_counter()
    with writer_lock(out_dir):
        finish_manifest(manifest, docs, rebuild_version_number(out_dir))
        manifest.segments = [new_segment_spec(version_name(manifest.version), len(docs), ann)]
        written = write_version(out_dir, VersionPlan(manifest, segment))
    timings["write"] = time.perf_counter() - started
    return written


def check_encoders(m: Manifest, encoders: dict[str, DocumentEncoder], index_dir: Path) -> None:
    """Encoders must cover exactly the index's stores and match the models that built them."""
    expected = {PRIMARY, *m.stores}
    missing, extra = sorted(expected - set(encoders)), sorted(set(encoders) - expected)
    if missing or extra:
        raise ValueError(f"index at {index_dir} needs encoders for {sorted(expected)}; "
                         f"missing: {missing or 'none'}, unexpected: {extra or 'none'}")
    p = encoders[PRIMARY]
    check_manifest(m, p.name, p.weights_hash, int(p.dim), index_dir=index_dir)
    for name, ident in m.stores.items():
        got = encoder_identity(encoders[name])
        differing = [k for k in ident if ident[k] != got[k]]
        if differing:
            raise IndexMismatchError(f"store {name!r} of index at {index_dir} was built with "
                                     f"{ident}, but the encoder given is {got}; differing: "
                                     f"{', '.join(differing)}")
