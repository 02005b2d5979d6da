"""How the Qdrant index (index/qdrant_backend.py) talks to a Qdrant engine: a few calls on named collections, in
Sieve's own terms, so that one index module runs on two libraries without a second copy of its logic:

- `ClientEngine` (here): qdrant-client, i.e. a Qdrant server (REST or gRPC) or the client's own local mode
  (":memory:" or a directory; pure Python, one process per directory);
- `EdgeEngine` (index/qdrant_edge_backend.py): qdrant-edge-py, Qdrant's Rust shard engine in this process.

The points both libraries return have `.id`, `.payload`, `.vector` (a dict by vector name) and, from `query`,
`.score`; the index reads those and nothing else. Every call raises whatever its library raises: the index turns
any failure into an IndexUnavailableError.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from .errors import IndexUnavailableError

log = logging.getLogger("sieve.index.qdrant")

DENSE, SPARSE = "dense", "bm25"
SparseValues = tuple[list[int], list[float]]  # (dimensions, values)


@dataclass(frozen=True)
class Layout:
    """How a new collection is spread (a server or cluster; local mode and edge ignore it)."""
    shards: int = 1
    replicas: int = 1
    write_consistency: int = 1
    on_disk: bool = False


@dataclass(frozen=True)
class Nearest:
    """One scored list: the `limit` points nearest to `vector` in the named vector `using` (a dense list of floats,
    or sparse (dimensions, values)), among the points `only` when given; each hit with its payload "id" and its
    dense vector."""
    using: str
    vector: list[float] | SparseValues
    limit: int
    only: list[int] | None = None


@dataclass(frozen=True)
class NewPoint:
    """A point to write: named vectors (a sparse one as (dimensions, values)) and the payload."""
    id: int
    vectors: dict[str, list[float] | SparseValues]
    payload: dict[str, Any]


class Engine(Protocol):
    def exists(self, name: str) -> bool: ...

    def create(self, name: str, dense: dict[str, int], sparse: str | None, layout: Layout) -> None:
        """A collection of dot-product dense vectors (name -> dimension) and, when `sparse` names it, one sparse
        vector with Qdrant's IDF modifier."""

    def drop(self, name: str) -> None: ...

    def query(self, name: str, asks: Sequence[Nearest]) -> list[list]:
        """Several scored lists in one call, best first."""

    def retrieve(self, name: str, ids: Sequence[int], payload, vectors) -> list:
        """The points held among `ids` (any order); payload / vectors: False, True or a list of names."""

    def count(self, name: str) -> int: ...

    def scroll(self, name: str, offset: int | None, limit: int, payload, vectors) -> tuple[list, int | None]:
        """Up to `limit` points from `offset` on, in point-id order, and the offset of the next page (None: done)."""

    def upsert(self, name: str, points: Sequence[NewPoint]) -> None:
        """Returns once the engine applied the points (a server: wait=true)."""

    def delete(self, name: str, ids: Sequence[int]) -> None: ...

    def set_payload(self, name: str, point: int, payload: dict) -> None: ...

    def settle(self, name: str) -> None:
        """After a bulk load: index what the engine would index in the background (edge has no background)."""

    def close(self) -> None: ...


class EngineOpener:
    """The engine, opened on first use. After a failed open (a local-mode folder or an edge shard another process
    holds, a directory not built yet) the next try waits `reopen_s`: calls in between fail at once, so no request
    waits on more than one open, and a request after that tries again: no restart is needed."""

    def __init__(self, open_engine: Callable[[], Engine], reopen_s: float, where: str, engine: Engine | None = None):
        self.open_engine, self.reopen_s, self.where, self.opened = open_engine, reopen_s, where, engine
        self.lock, self.failed_at, self.error = threading.Lock(), float("-inf"), ""

    def engine(self) -> Engine:
        with self.lock:
            if self.opened is not None:
                return self.opened
            wait = self.failed_at + self.reopen_s - time.monotonic()
            if wait > 0:
                raise IndexUnavailableError(f"the Qdrant index ({self.where}) could not be opened ({self.error}); "
                                            f"next try in {wait * 1000:.0f} ms")
            try:
                self.opened = self.open_engine()
            except ModuleNotFoundError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever the library raises for a held or missing store
                self.failed_at, self.error = time.monotonic(), f"{type(exc).__name__}: {str(exc)[:300]}"
                raise IndexUnavailableError(f"the Qdrant index ({self.where}) could not be opened: {self.error}") \
                    from exc
            log.info("opened the Qdrant index (%s)", self.where)
            return self.opened

    def close(self) -> None:
        with self.lock:
            engine, self.opened = self.opened, None
        try:
            if engine is not None:
                engine.close()
        except Exception:  # noqa: BLE001 - closing a client of an unreachable server
            log.debug("closing the Qdrant engine failed", exc_info=True)


class ClientEngine:
    """qdrant-client: a server (`location` http(s)://...), or the client's local mode (":memory:" or a directory)."""

    def __init__(self, config, client=None):
        self.config = config
        self.client = client if client is not None else open_client(config)

    def exists(self, name: str) -> bool:
        return self.client.collection_exists(name)

    def create(self, name: str, dense: dict[str, int], sparse: str | None, layout: Layout) -> None:
        from qdrant_client import models

        vectors = {n: models.VectorParams(size=d, distance=models.Distance.DOT, on_disk=layout.on_disk)
                   for n, d in dense.items()}
        sparse_config = {sparse: models.SparseVectorParams(modifier=models.Modifier.IDF)} if sparse else None
        self.client.create_collection(name, vectors_config=vectors, sparse_vectors_config=sparse_config,
                                      shard_number=layout.shards, replication_factor=layout.replicas,
                                      write_consistency_factor=layout.write_consistency)

    def drop(self, name: str) -> None:
        self.client.delete_collection(name)

    def request(self, ask: Nearest):
        from qdrant_client import models

        where = None if ask.only is None else models.Filter(must=[models.HasIdCondition(has_id=ask.only)])
        if ask.using == SPARSE:
            query, params = models.SparseVector(indices=ask.vector[0], values=ask.vector[1]), None
        else:
            query, params = ask.vector, models.SearchParams(hnsw_ef=self.config.hnsw_ef, exact=self.config.exact)
        return models.QueryRequest(query=query, using=ask.using, limit=ask.limit, with_payload=["id"],
                                   with_vector=[DENSE], filter=where, params=params)

    def query(self, name: str, asks: Sequence[Nearest]) -> list[list]:
        answers = self.client.query_batch_points(name, requests=[self.request(a) for a in asks])
        return [answer.points for answer in answers]

    def retrieve(self, name: str, ids: Sequence[int], payload, vectors) -> list:
        return self.client.retrieve(name, ids=list(ids), with_payload=payload, with_vectors=vectors)

    def count(self, name: str) -> int:
        return int(self.client.count(name, exact=True).count)

    def scroll(self, name: str, offset: int | None, limit: int, payload, vectors) -> tuple[list, int | None]:
        return self.client.scroll(name, offset=offset, limit=limit, with_payload=payload, with_vectors=vectors)

    def upsert(self, name: str, points: Sequence[NewPoint]) -> None:
        from qdrant_client import models

        def named(vectors: dict) -> dict:
            return {n: models.SparseVector(indices=v[0], values=v[1]) if isinstance(v, tuple) else v
                    for n, v in vectors.items()}

        self.client.upsert(name, wait=True, points=[models.PointStruct(id=p.id, vector=named(p.vectors),
                                                                       payload=p.payload) for p in points])

    def delete(self, name: str, ids: Sequence[int]) -> None:
        from qdrant_client import models

        self.client.delete(name, points_selector=models.PointIdsList(points=list(ids)), wait=True)

    def set_payload(self, name: str, point: int, payload: dict) -> None:
        self.client.set_payload(name, payload=payload, points=[point], wait=True)

    def settle(self, name: str) -> None:
        pass  # a server optimizes in the background; local mode has nothing to build

    def close(self) -> None:
        self.client.close()


def open_client(config):
    try:
        from qdrant_client import QdrantClient
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("the Qdrant backend needs qdrant-client: pip install 'sieve[qdrant]'") from exc

    if config.location == ":memory:":
        return QdrantClient(":memory:")
    if config.location.startswith(("http://", "https://")):
        return QdrantClient(url=config.location, api_key=config.api_key, timeout=config.timeout_s,
                            prefer_grpc=config.prefer_grpc, check_compatibility=False)  # no call at start-up
    return QdrantClient(path=config.location)  # holds the folder's lock until closed
