"""`sieve index build --backend qdrant` (or qdrant-edge): create a collection and bulk-load a corpus into it.

The bi-encoder vectors (and any extra store's) come from the same content-addressed cache as a local build
(index/cache.py), the BM25 term-frequency vectors from Sieve's analyzer (index/bm25_vectors.py); the documents go
in the payload. Loading is in batches, each waited for; the metadata point is written last, so a collection whose
build died half-way has no metadata and the service refuses it with a clear error.
"""
from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Sequence

from .bm25_vectors import SparseBM25
from .builder import check_unique_ids
from .cache import encode_cached
from .corpus import Document, corpus_hash
from .encoder import DocumentEncoder, encoder_identity
from .lexical import LexicalConfig
from .qdrant_backend import META_POINT, QdrantConfig, QdrantIndex
from .qdrant_engine import DENSE, SPARSE, Layout, NewPoint

__all__ = ["Layout", "build_qdrant", "create_collections"]


def create_collections(index: QdrantIndex, dims: dict[str, int], lexical: bool, layout: Layout,
                       recreate: bool) -> None:
    for name in (index.name, index.meta_name):
        if index.call("exists", lambda e, n=name: e.exists(n)):
            if not recreate:
                raise ValueError(f"Qdrant collection {name!r} exists; pass --recreate to replace it")
            index.call("drop", lambda e, n=name: e.drop(n))
    vectors = {(DENSE if store == "primary" else store): dim for store, dim in dims.items()}
    index.call("create", lambda e: e.create(index.name, vectors, SPARSE if lexical else None, layout))
    index.call("create", lambda e: e.create(index.meta_name, {"_": 1}, None, Layout(replicas=layout.replicas)))


def build_qdrant(docs: Sequence[Document], encoders: dict[str, DocumentEncoder], config: QdrantConfig, *,
                 client=None, lexical: LexicalConfig | None = LexicalConfig(), layout: Layout = Layout(),
                 cache_dir: Path | None = None, recreate: bool = False, progress: bool = True,
                 batch: int = 256) -> QdrantIndex:
    """A new collection holding `docs`; encoders: "primary" (the bi-encoder) and any extra store ("cmc", "mix").
    `client`: an existing qdrant-client (config.engine "client")."""
    docs = list(docs)
    check_unique_ids(docs, "corpus")
    texts = [d.full_text for d in docs]
    vectors = {store: encode_cached(enc, texts, cache_dir, progress) for store, enc in encoders.items()}
    primary = encoders["primary"]
    index = QdrantIndex(config, client)
    create_collections(index, {s: int(e.dim) for s, e in encoders.items()}, lexical is not None, layout, recreate)
    sparse = SparseBM25.fitted(lexical, texts) if lexical is not None else None
    meta = {"model_name": primary.name, "model_hash": primary.weights_hash, "dim": int(primary.dim),
            "lexical": lexical.to_dict() if lexical else None, "avgdl": sparse.avgdl if sparse else None,
            "stores": {s: encoder_identity(e) for s, e in encoders.items() if s != "primary"},
            "corpus_hash": corpus_hash(docs), "version": 0, "generation": secrets.token_hex(8),
            "built_at": time.time()}
    index.meta = dict(meta)  # the writes below read the analyzer and stores from it
    bar = _progress(len(docs), progress)
    index.upsert(docs, vectors, batch=batch, progress=bar.update if bar else None, announce=False)
    if bar:
        bar.close()
    index.call("settle", lambda e: e.settle(index.name))
    meta["version"] = 1
    index.call("meta", lambda e: e.upsert(index.meta_name, [NewPoint(META_POINT, {"_": [0.0]}, meta)]))
    index.load_meta(force=True)
    index.refresh_size()
    return index


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="qdrant upsert", unit="doc")
