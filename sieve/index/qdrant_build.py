"""`sieve index build --backend qdrant`: create a collection and bulk-load a corpus into it.

The bi-encoder vectors (and any extra store's) come from the same content-addressed cache as a local build
(index/cache.py), the BM25 term-frequency vectors from Sieve's analyzer (index/bm25_vectors.py); the documents go
in the payload. Loading is in batches, each waited for; the metadata point is written last, so a collection whose
build died half-way has no metadata and the service refuses it with a clear error.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .bm25_vectors import SparseBM25
from .builder import check_unique_ids
from .cache import encode_cached
from .corpus import Document, corpus_hash
from .encoder import DocumentEncoder, encoder_identity
from .lexical import LexicalConfig
from .qdrant_backend import DENSE, META_POINT, SPARSE, QdrantConfig, QdrantIndex


@dataclass(frozen=True)
class Layout:
    """How the collection is spread (a server or cluster; the client's local mode ignores it)."""
    shards: int = 1
    replicas: int = 1
    write_consistency: int = 1
    on_disk: bool = False


def create_collections(index: QdrantIndex, dims: dict[str, int], lexical: bool, layout: Layout,
                       recreate: bool) -> None:
    from qdrant_client import models

    client = index.client
    for name in (index.name, index.meta_name):
        if index.call("exists", lambda n=name: client.collection_exists(n)):
            if not recreate:
                raise ValueError(f"Qdrant collection {name!r} exists; pass --recreate to replace it")
            index.call("drop", lambda n=name: client.delete_collection(n))
    vectors = {(DENSE if store == "primary" else store): models.VectorParams(size=dim, distance=models.Distance.DOT,
                                                                            on_disk=layout.on_disk)
               for store, dim in dims.items()}
    sparse = {SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)} if lexical else None
    index.call("create", lambda: client.create_collection(
        index.name, vectors_config=vectors, sparse_vectors_config=sparse, shard_number=layout.shards,
        replication_factor=layout.replicas, write_consistency_factor=layout.write_consistency))
    index.call("create", lambda: client.create_collection(
        index.meta_name, vectors_config={"_": models.VectorParams(size=1, distance=models.Distance.DOT)},
        replication_factor=layout.replicas))


def build_qdrant(docs: Sequence[Document], encoders: dict[str, DocumentEncoder], config: QdrantConfig, *,
                 client=None, lexical: LexicalConfig | None = LexicalConfig(), layout: Layout = Layout(),
                 cache_dir: Path | None = None, recreate: bool = False, progress: bool = True,
                 batch: int = 256) -> QdrantIndex:
    """A new collection holding `docs`; encoders: "primary" (the bi-encoder) and any extra store ("cmc", "mix")."""
    from qdrant_client import models

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
    meta["version"] = 1
    index.call("meta", lambda: index.client.upsert(index.meta_name, wait=True, points=[
        models.PointStruct(id=META_POINT, vector={"_": [0.0]}, payload=meta)]))
    index.load_meta(force=True)
    index.refresh_size()
    return index


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="qdrant upsert", unit="doc")
