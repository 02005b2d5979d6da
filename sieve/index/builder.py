"""Build an index and modify it (add, delete, add a store); every call writes a new version."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .cache import encode_cached
from .corpus import Document
from .encoder import DocumentEncoder, checked_embeddings, encoder_identity
from .errors import IndexMismatchError, UnknownDocumentError
from .lexical import LexicalConfig
from .layout import live_version_number, rebuild_version_number, writer_lock
from .manifest import DTYPES, FORMAT_VERSION, Manifest, check_manifest
from .storage import DOCS_FILE, EMBEDDINGS_FILE, FAISS_FILE, STORES_DIR, row_chunks
from .vectors import resolve_params
from .writer import LiveVersion, Rows, VersionPlan, finish_manifest, write_version

PRIMARY = "primary"
_STORE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def _check_unique_ids(docs: Sequence[Document], what: str) -> None:
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
    _check_unique_ids(docs, "corpus")
    if lexical is not None:
        lexical.check()
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    for name in store_names:
        _check_store_name(name)
    return resolve_params(faiss_kind, faiss_params, len(docs))


def build_index(docs: Sequence[Document], encoder: DocumentEncoder, out_dir: str | Path, *,
                dtype: str = "float32", faiss_kind: str = "flat",
                faiss_params: dict | None = None, cache_dir: Path | None = None,
                progress: bool = True,
                extra_stores: dict[str, DocumentEncoder] | None = None,
                lexical: LexicalConfig | None = LexicalConfig()) -> Manifest:
    """Encode `docs` and publish them as a new version of the index at `out_dir`, with a BM25 part unless
    `lexical` is None."""
    docs, out_dir, extra_stores = list(docs), Path(out_dir), dict(extra_stores or {})
    params = _validate_build(docs, dtype, faiss_kind, faiss_params, list(extra_stores), lexical)
    texts = [d.full_text for d in docs]
    arrays = {None: _in_memory(encode_cached(encoder, texts, cache_dir, progress))}
    for name, enc in extra_stores.items():
        arrays[name] = _in_memory(encode_cached(enc, texts, cache_dir, progress))
    manifest = Manifest(
        format_version=FORMAT_VERSION, model_name=encoder.name,
        model_hash=encoder.weights_hash, dim=int(encoder.dim), count=0, dtype=dtype,
        faiss_kind=faiss_kind, faiss_params=params, corpus_hash="", created="", version=0,
        stores={n: encoder_identity(e) for n, e in extra_stores.items()},
        lexical=lexical.to_dict() if lexical is not None else {})
    with writer_lock(out_dir):
        finish_manifest(manifest, docs, rebuild_version_number(out_dir))
        return write_version(out_dir, VersionPlan(manifest, docs, arrays))


def _check_encoders(m: Manifest, encoders: dict[str, DocumentEncoder], index_dir: Path) -> None:
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


def _patched(old: np.ndarray, rows: np.ndarray, new: np.ndarray,
             src: np.ndarray) -> Iterator[np.ndarray]:
    """Blocks of `old` with old[rows[i]] replaced by new[src[i]]."""
    start = 0
    for block in row_chunks(old):
        block = np.array(block, dtype=np.float32)  # writable copy of the mapped rows
        sel = (rows >= start) & (rows < start + len(block))
        block[rows[sel] - start] = new[src[sel]]
        start += len(block)
        yield block


@dataclass
class _Merge:
    """Where added documents go: replaced rows keep their place, new ids are appended."""
    docs: list[Document]      # the merged document list of the new version
    replace_rows: np.ndarray  # rows of existing ids being replaced ...
    replace_src: np.ndarray   # ... by these positions in the added batch
    appended: list[int]       # positions in the added batch that become new rows

    @classmethod
    def plan(cls, existing: list[Document], added: list[Document]) -> "_Merge":
        row_of = {d.id: i for i, d in enumerate(existing)}
        pairs = [(row_of[d.id], j) for j, d in enumerate(added) if d.id in row_of]
        appended = [j for j, d in enumerate(added) if d.id not in row_of]
        merged = list(existing)
        for row, j in pairs:
            merged[row] = added[j]
        merged += [added[j] for j in appended]
        return cls(merged, np.array([r for r, _ in pairs], dtype=np.int64),
                   np.array([j for _, j in pairs], dtype=np.int64), appended)

    def embedding_rows(self, old: np.ndarray, new: np.ndarray) -> Rows:
        def parts() -> Iterator[np.ndarray]:
            yield from _patched(old, self.replace_rows, new, self.replace_src)
            yield new[self.appended]
        return Rows((len(self.docs), old.shape[1]), parts)


def add_documents(index_dir: str | Path, docs: Sequence[Document],
                  encoders: dict[str, DocumentEncoder], progress: bool = False) -> Manifest:
    """Add documents; an existing id is replaced in place, new ids are appended in order."""
    docs, index_dir = list(docs), Path(index_dir)
    _check_unique_ids(docs, "documents to add")
    if PRIMARY not in encoders:
        raise ValueError(f"encoders[{PRIMARY!r}] is required to add documents")
    with writer_lock(index_dir):
        live = LiveVersion.open(index_dir)
        _check_encoders(live.manifest, encoders, index_dir)
        merge = _Merge.plan(live.docs(), docs)
        texts = [d.full_text for d in docs]
        arrays = {}
        for name, enc in encoders.items():
            store = None if name == PRIMARY else name
            new = checked_embeddings(enc, texts, progress)
            arrays[store] = merge.embedding_rows(live.embeddings(store), new)
        m = finish_manifest(replace(live.manifest), merge.docs,
                            live_version_number(index_dir) + 1)
        return write_version(index_dir, VersionPlan(m, merge.docs, arrays))


def delete_documents(index_dir: str | Path, ids: Sequence[str]) -> Manifest:
    """Delete documents by id; if any id is unknown nothing is changed."""
    index_dir = Path(index_dir)
    with writer_lock(index_dir):
        live = LiveVersion.open(index_dir)
        docs = live.docs()
        present = {d.id for d in docs}
        unknown = [i for i in dict.fromkeys(ids) if i not in present]
        if unknown:
            raise UnknownDocumentError(unknown, size=len(docs))
        gone = set(ids)
        keep = np.array([r for r, d in enumerate(docs) if d.id not in gone], dtype=np.int64)
        if len(keep) == 0:
            raise ValueError("cannot delete every document; an index must hold at least "
                             "one (build a new index instead)")
        kept = [docs[r] for r in keep]
        arrays = {}
        for store in [None, *live.manifest.stores]:
            old = live.embeddings(store)
            arrays[store] = Rows((len(keep), old.shape[1]), lambda o=old: row_chunks(o, keep))
        m = finish_manifest(replace(live.manifest), kept, live_version_number(index_dir) + 1)
        return write_version(index_dir, VersionPlan(m, kept, arrays))


def add_store(index_dir: str | Path, name: str, encoder: DocumentEncoder,
              cache_dir: Path | None = None, progress: bool = True) -> Manifest:
    """Add (or replace) an extra embedding store covering every current document."""
    _check_store_name(name)
    index_dir = Path(index_dir)
    with writer_lock(index_dir):
        live = LiveVersion.open(index_dir)
        docs = live.docs()
        emb = encode_cached(encoder, [d.full_text for d in docs], cache_dir, progress)
        stores = {**live.manifest.stores, name: encoder_identity(encoder)}
        reuse = {rel: live.path / rel for rel in (EMBEDDINGS_FILE, DOCS_FILE, FAISS_FILE)}
        reuse.update({f"{STORES_DIR}/{s}.npy": live.path / STORES_DIR / f"{s}.npy"
                      for s in live.manifest.stores if s != name})
        reuse.update(live.lexical_files())
        m = finish_manifest(replace(live.manifest, stores=stores), docs,
                            live_version_number(index_dir) + 1)
        return write_version(index_dir, VersionPlan(m, None, {name: _in_memory(emb)}, reuse))
