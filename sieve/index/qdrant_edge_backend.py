"""The Qdrant index on qdrant-edge-py (SIEVE_INDEX_BACKEND=qdrant-edge): Qdrant's Rust shard engine in this process,
no server. The same collection layout and the same index (index/qdrant_backend.py) as on a server; this module is
only the engine (index/qdrant_engine.py's calls).

A collection is a shard directory, DIR/NAME (DIR/NAME__sieve holds the metadata point). A shard's write-ahead log
is locked by the process that opened it, so one process serves a directory at a time (a second one cannot open it:
503 until the first lets go; no replicas share it). A write returns once the shard applied it and wrote its WAL;
`close()` flushes the segments. Edge has no background optimizer: a build calls `settle` (`optimize()`, which builds
the HNSW graph) once loaded.

BM25's IDF is computed over the live points that hold the sparse vector (`IdfParams(corpus=Filter())`), as the
client's local mode computes it. Edge 0.9.0's default (collection-wide) IDF differs: N counts only points whose
sparse vector is non-empty, and after deletes its statistics lag until a later upsert (observed here, see
docs/index.md), so BM25 scores would drift from the local index's.
"""
from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Sequence

from .qdrant_engine import DENSE, SPARSE, Layout, NewPoint, Nearest


def edge_module():
    try:
        import qdrant_edge
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("the qdrant-edge backend needs qdrant-edge-py: pip install 'sieve[qdrant-edge]'") \
            from exc
    return qdrant_edge


class EdgeEngine:
    """Shards under one directory, each opened once and kept open (opening takes the WAL's lock)."""

    def __init__(self, config):
        self.qe, self.config, self.root = edge_module(), config, Path(config.location)
        self.shards: dict = {}
        self.lock = threading.Lock()
        for name in (config.collection, f"{config.collection}__sieve"):  # a shard another process holds fails here
            if (self.root / name).is_dir():
                self.shard(name)

    def shard(self, name: str):
        with self.lock:
            if name not in self.shards:
                self.shards[name] = self.qe.EdgeShard.load(str(self.root / name))  # fails if not built yet
            return self.shards[name]

    def exists(self, name: str) -> bool:
        return name in self.shards or (self.root / name).is_dir()

    def create(self, name: str, dense: dict[str, int], sparse: str | None, layout: Layout) -> None:
        qe = self.qe
        vectors = {n: qe.EdgeVectorParams(size=d, distance=qe.Distance.Dot, on_disk=layout.on_disk or None)
                   for n, d in dense.items()}
        sparse_config = {sparse: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)} if sparse else None
        self.root.mkdir(parents=True, exist_ok=True)
        shard = qe.EdgeShard.create(str(self.root / name), qe.EdgeConfig(vectors=vectors, sparse_vectors=sparse_config))
        with self.lock:
            self.shards[name] = shard

    def drop(self, name: str) -> None:
        with self.lock:
            shard = self.shards.pop(name, None)
        if shard is not None:
            shard.close()
        shutil.rmtree(self.root / name, ignore_errors=True)

    def request(self, ask: Nearest):
        qe = self.qe
        where = None if ask.only is None else qe.Filter(must=[qe.HasIdCondition(set(ask.only))])
        if ask.using == SPARSE:  # IDF of the live points (see the module's docstring)
            query = qe.SparseVector(list(ask.vector[0]), list(ask.vector[1]))
            params = qe.SearchParams(idf=qe.IdfParams(corpus=qe.Filter()))
        else:
            query, params = list(ask.vector), qe.SearchParams(hnsw_ef=self.config.hnsw_ef, exact=self.config.exact)
        return qe.QueryRequest(limit=ask.limit, query=qe.Query.Nearest(query, using=ask.using), with_payload=["id"],
                               with_vector=[DENSE], filter=where, params=params)

    def query(self, name: str, asks: Sequence[Nearest]) -> list[list]:
        return self.shard(name).query_batch(self.qe.QueryBatchRequest([self.request(a) for a in asks]))

    def retrieve(self, name: str, ids: Sequence[int], payload, vectors) -> list:
        return self.shard(name).retrieve(list(ids), payload, vectors)

    def count(self, name: str) -> int:
        return int(self.shard(name).count(self.qe.CountRequest(exact=True)))

    def scroll(self, name: str, offset: int | None, limit: int, payload, vectors) -> tuple[list, int | None]:
        return self.shard(name).scroll(self.qe.ScrollRequest(offset=offset, limit=limit, with_payload=payload,
                                                             with_vector=vectors))

    def upsert(self, name: str, points: Sequence[NewPoint]) -> None:
        qe = self.qe

        def named(vectors: dict) -> dict:
            return {n: qe.SparseVector(list(v[0]), list(v[1])) if isinstance(v, tuple) else v
                    for n, v in vectors.items()}

        self.shard(name).update(qe.UpdateOperation.upsert_points([qe.Point(p.id, named(p.vectors), p.payload)
                                                                  for p in points]))

    def delete(self, name: str, ids: Sequence[int]) -> None:
        self.shard(name).update(self.qe.UpdateOperation.delete_points(list(ids)))

    def set_payload(self, name: str, point: int, payload: dict) -> None:
        self.shard(name).update(self.qe.UpdateOperation.set_payload([point], payload))

    def settle(self, name: str) -> None:
        self.shard(name).optimize()

    def close(self) -> None:
        with self.lock:
            shards, self.shards = list(self.shards.values()), {}
        for shard in shards:
            shard.close()
