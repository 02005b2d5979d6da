"""The index as a Qdrant collection: index/protocol.py's contract on Qdrant's engine, reached through
index/qdrant_engine.py (qdrant-client: a server or the client's local mode) or index/qdrant_edge_backend.py
(qdrant-edge-py: the shard engine in process).

Layout of collection NAME: one point per document, point id = a 63-bit hash of the document id (`point_id`), named
vectors "dense" (the bi-encoder's, dot product) and one per extra store ("cmc", "mix"), the sparse vector "bm25"
with Qdrant's IDF modifier (index/bm25_vectors.py), the payload {"id", "title", "text"}. Collection NAME__sieve
holds one metadata point: the model identity, the analyzer and avgdl, the stores, and a write generation that every
acknowledged write replaces (the result cache's key, so no cached answer outlives a write on any replica).

Every write waits for Qdrant (`wait=true`) and is acknowledged only after Qdrant acknowledged it and the generation
moved. Anything Qdrant does not answer, answers late or refuses is an IndexUnavailableError (HTTP 503). The engine
is opened on first use and, if that failed (a local-mode folder or an edge shard another process holds), again on
a later call, at most once per `reopen_s` (index/qdrant_engine.py `EngineOpener`); a server's client holds no
connection state between calls: so the service recovers by itself when Qdrant is back.
"""
from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import numpy as np

from .corpus import Document
from .errors import IndexMismatchError, IndexUnavailableError, UnknownDocumentError
from .lexical import LexicalConfig
from .bm25_vectors import SparseBM25
from .protocol import Hits
from .qdrant_engine import DENSE, SPARSE, ClientEngine, Engine, EngineOpener, Nearest, NewPoint

log = logging.getLogger("sieve.index.qdrant")
META_POINT = 0


def point_id(doc_id: str) -> int:
    """A document's point id: 63 bits of its blake2b (a collision among 1e6 ids has odds of about 1e-7)."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class QdrantConfig:
    location: str  # client: http(s)://host:port, ":memory:" or a directory (local mode); edge: the shards' directory
    collection: str = "sieve"
    api_key: str | None = None
    timeout_s: float = 2.0
    prefer_grpc: bool = False
    hnsw_ef: int | None = None  # search-time beam of Qdrant's HNSW (None: the collection's default)
    exact: bool = False  # True: Qdrant searches exhaustively (recall 1, slower)
    engine: Literal["client", "edge"] = "client"
    reopen_s: float = 0.5  # least time between two tries to open an engine that could not be opened

    @property
    def where(self) -> str:
        """What names this Qdrant in error messages."""
        if self.engine == "edge":
            return f"edge {self.location}"
        return self.location if self.location.startswith("http") else "local mode"

    def open_engine(self) -> Engine:
        if self.engine == "edge":
            from .qdrant_edge_backend import EdgeEngine

            return EdgeEngine(self)
        return ClientEngine(self)


class QdrantIndex:
    """A Qdrant collection behind the IndexBackend contract. `client`: an existing qdrant-client (tests,
    ":memory:"); `engine`: an existing engine; neither: the config's, opened on first use."""

    returns_vectors = True

    def __init__(self, config: QdrantConfig, client=None, *, engine: Engine | None = None,
                 on_call: Callable[[str, bool], None] | None = None):
        self.config, self.name, self.meta_name = config, config.collection, f"{config.collection}__sieve"
        given = engine if engine is not None else ClientEngine(config, client) if client is not None else None
        self.opener = EngineOpener(config.open_engine, config.reopen_s, config.where, given)
        self.on_call = on_call  # (operation, ok) for the service's metrics
        self.meta: dict | None = None
        self.expect: dict | None = None  # model identity the metadata must show (check_model)
        self.size, self.version, self._lock = 0, 0, threading.Lock()
        self._analyzer = None

    # -- calls to Qdrant ------------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        """The engine (opened now if it was not; IndexUnavailableError if it cannot be)."""
        return self.call("open", lambda e: e)

    def call(self, op: str, fn: Callable[[Engine], Any]) -> Any:
        """Runs one engine call; every failure of Qdrant or of the way to it is an IndexUnavailableError."""
        try:
            result = fn(self.opener.engine())
        except (UnknownDocumentError, IndexMismatchError, ModuleNotFoundError):
            raise
        except IndexUnavailableError:
            self.note(op, False)
            raise
        except Exception as exc:  # noqa: BLE001 - connection refused, timeout, 5xx, refused write, missing collection
            self.note(op, False)
            raise IndexUnavailableError(f"the Qdrant index ({self.config.where}, collection {self.name!r}) failed on "
                                        f"{op}: {type(exc).__name__}: {str(exc)[:300]}") from exc
        self.note(op, True)
        return result

    def note(self, op: str, ok: bool) -> None:
        if self.on_call is not None:
            self.on_call(op, ok)

    def load_meta(self, force: bool = False) -> dict:
        if self.meta is not None and not force:
            return self.meta
        points = self.call("meta", lambda e: e.retrieve(self.meta_name, [META_POINT], True, False))
        if not points:
            raise IndexUnavailableError(f"collection {self.meta_name!r} holds no Sieve metadata; build the "
                                        "collection with `sieve index build --backend qdrant`")
        meta = dict(points[0].payload)
        self.check_identity(meta)
        with self._lock:
            self.meta, self.version = meta, int(meta["version"])
            self._analyzer = None
        return meta

    def check_model(self, model_name: str | None, model_hash: str | None, dim: int | None) -> None:
        """Refuse a collection built by another model, now and whenever the metadata is read again (a collection
        built after the service started, or rebuilt under it)."""
        self.expect = {"model_name": model_name, "model_hash": model_hash, "dim": dim}
        self.load_meta(force=True)

    def check_identity(self, meta: dict) -> None:
        for key, want in (self.expect or {}).items():
            if want is not None and meta.get(key) != want:
                raise IndexMismatchError(f"Qdrant collection {self.name!r} was built with {key} {meta.get(key)!r}, "
                                         f"this server has {want!r}; rebuild it with `sieve index build --backend "
                                         "qdrant` and this model")

    def refresh_size(self) -> int:
        self.size = self.call("count", lambda e: e.count(self.name))
        return self.size

    # -- contract: state ------------------------------------------------------------------------------------
    @property
    def has_lexical(self) -> bool:
        return self.meta is None or self.meta.get("lexical") is not None  # unknown while Qdrant is down: assume so

    def sparse(self) -> SparseBM25:
        meta = self.load_meta()
        return SparseBM25(LexicalConfig.from_dict(meta["lexical"]), float(meta["avgdl"]))

    def analyzer(self):
        if self._analyzer is None:
            self._analyzer = self.sparse().analyzer()
        return self._analyzer

    def identity(self) -> str:
        meta = self.load_meta(force=True)
        scheme = "qdrant-edge" if self.config.engine == "edge" else "qdrant"
        return f"{scheme}:{self.config.location}:{self.name}:{meta['generation']}"

    def check_ready(self) -> None:
        self.load_meta(force=True)
        self.refresh_size()

    def has_store(self, name: str) -> bool:
        return name in (self.load_meta().get("stores") or {})

    # -- contract: first stage ------------------------------------------------------------------------------
    def dense_request(self, vector: np.ndarray, k: int) -> Nearest:
        return Nearest(DENSE, np.asarray(vector, dtype=np.float32).tolist(), max(k, 1))

    def sparse_request(self, query: str, k: int, rows: Sequence[int] | None = None) -> Nearest | None:
        dims, values = SparseBM25.query(self.analyzer(), query)
        if not dims:
            return None
        return Nearest(SPARSE, (dims, values), max(k, 1), None if rows is None else [int(r) for r in rows])

    def batch(self, requests: list[Nearest | None]) -> list[Hits]:
        """Several scored lists in one round trip (None requests answer an empty list)."""
        live = [r for r in requests if r is not None]
        answers = iter(self.call("query", lambda e: e.query(self.name, live)) if live else [])
        return [self.to_hits(next(answers)) if r is not None else self.empty() for r in requests]

    def to_hits(self, points) -> Hits:
        dim = int(self.load_meta()["dim"])
        vectors = np.asarray([p.vector[DENSE] for p in points], dtype=np.float32).reshape(len(points), dim)
        return Hits([p.id for p in points], [p.score for p in points], [p.payload["id"] for p in points], vectors)

    def empty(self) -> Hits:
        return Hits([], [], [], np.empty((0, int(self.load_meta()["dim"])), np.float32))

    def dense_hits(self, vector: np.ndarray, k: int) -> Hits:
        return self.batch([self.dense_request(vector, k)])[0]

    def lexical_hits(self, query: str, k: int) -> Hits:
        return self.batch([self.sparse_request(query, k)])[0]

    def both_hits(self, vector: np.ndarray, query: str, depth: int) -> tuple[Hits, Hits]:
        dense, lexical = self.batch([self.dense_request(vector, depth), self.sparse_request(query, depth)])
        return dense, lexical

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        lists = self.batch([self.dense_request(q, k) for q in np.asarray(queries, dtype=np.float32)])
        n = min((len(h) for h in lists), default=0)
        return (np.stack([h.scores[:n] for h in lists]) if lists else np.empty((0, n), np.float32),
                np.stack([h.rows[:n] for h in lists]) if lists else np.empty((0, n), np.int64))

    def search_lexical(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        hits = self.lexical_hits(query, k)
        return hits.scores, hits.rows

    def lexical_scores_of(self, query: str, rows: Sequence[int]) -> np.ndarray:
        rows = [int(r) for r in rows]
        out = np.zeros(len(rows), dtype=np.float32)
        if not rows:
            return out
        hits = self.batch([self.sparse_request(query, len(rows), rows)])[0]
        where = {r: i for i, r in enumerate(rows)}
        for row, score in zip(hits.rows.tolist(), hits.scores.tolist()):
            out[where[row]] = score
        return out

    # -- contract: by handle --------------------------------------------------------------------------------
    def points(self, rows: Sequence[int], payload, vectors) -> list:
        """The points of `rows` in that order; UnknownDocumentError for handles Qdrant does not hold."""
        wanted = [int(r) for r in rows]
        got = self.call("retrieve", lambda e: e.retrieve(self.name, list(dict.fromkeys(wanted)), payload, vectors))
        found = {p.id: p for p in got}
        missing = [r for r in wanted if r not in found]
        if missing:
            raise UnknownDocumentError([str(r) for r in missing], size=self.size)
        return [found[r] for r in wanted]

    def embeddings(self, rows: Sequence[int], store: str | None = None) -> np.ndarray:
        name = store or DENSE
        if store is not None and not self.has_store(store):
            raise ValueError(f"unknown embedding store {store!r}; this collection has "
                             f"{sorted(self.load_meta().get('stores') or {}) or 'no extra stores'}")
        dim = int(self.load_meta()["dim"] if store is None else self.meta["stores"][store]["dim"])
        points = self.points(rows, False, [name])
        return np.asarray([p.vector[name] for p in points], dtype=np.float32).reshape(len(points), dim)

    def documents(self, rows: Sequence[int]) -> list[Document]:
        return [Document(p.payload["id"], p.payload.get("title", ""), p.payload.get("text", ""))
                for p in self.points(rows, True, False)]

    def ids(self, rows: Sequence[int]) -> list[str]:
        return [p.payload["id"] for p in self.points(rows, ["id"], False)]

    def every_point(self, page: int = 1024) -> tuple[np.ndarray, list[Document], np.ndarray]:
        """Every document of the collection in point-id order: (handles (N,) int64, documents, dense vectors
        (N, d) float32), read page by page (`sieve adapt` trains on the whole collection)."""
        rows, docs, vectors, offset = [], [], [], None
        while True:
            points, offset = self.call("scroll", lambda e, at=offset: e.scroll(self.name, at, page, True, [DENSE]))
            rows += [p.id for p in points]
            docs += [Document(p.payload["id"], p.payload.get("title", ""), p.payload.get("text", "")) for p in points]
            vectors += [p.vector[DENSE] for p in points]
            if offset is None or not points:
                break
        dim = int(self.load_meta()["dim"])
        return np.asarray(rows, np.int64), docs, np.asarray(vectors, np.float32).reshape(len(rows), dim)

    def held(self, rows: Sequence[int]) -> set[int]:
        return {p.id for p in self.call("retrieve", lambda e: e.retrieve(self.name, list(dict.fromkeys(rows)),
                                                                          False, False))}

    def rows_for_ids(self, ids: Sequence[str]) -> list[int]:
        rows = [point_id(i) for i in ids]
        held = self.held(rows)
        unknown = [i for i, r in zip(ids, rows) if r not in held]
        if unknown:
            raise UnknownDocumentError(list(dict.fromkeys(unknown)), size=self.size)
        return rows

    def has_id(self, doc_id: str) -> bool:
        return bool(self.held([point_id(doc_id)]))

    def close(self) -> None:
        self.opener.close()

    # -- writes ---------------------------------------------------------------------------------------------
    def new_points(self, docs: Sequence[Document], vectors: dict[str, np.ndarray]) -> list[NewPoint]:
        lexical = bool(self.meta.get("lexical"))
        sparse = self.sparse().documents(self.analyzer(), [d.full_text for d in docs]) if lexical \
            else [([], [])] * len(docs)
        points = []
        for i, (doc, (dims, values)) in enumerate(zip(docs, sparse)):
            named: dict = {(DENSE if store == "primary" else store): array[i].tolist() for store, array in vectors.items()}
            if lexical:  # empty too: Qdrant's IDF counts only points that have the sparse vector
                named[SPARSE] = (dims, values)
            points.append(NewPoint(point_id(doc.id), named, {"id": doc.id, "title": doc.title, "text": doc.text}))
        return points

    def upsert(self, docs: Sequence[Document], vectors: dict[str, np.ndarray], batch: int = 256,
               progress: Callable[[int], None] | None = None, announce: bool = True) -> None:
        """Writes the documents (vectors by store: "primary", "cmc", ...), each batch waited for, then moves the
        generation (`announce`; a build writes the metadata itself). Returns only when Qdrant acknowledged it all."""
        if announce:  # read now: a collection rebuilt by another model is refused before anything is written
            self.load_meta(force=True)
        expected = {"primary", *(self.meta.get("stores") or {})}
        if set(vectors) != expected:
            raise ValueError(f"this collection needs vectors for {sorted(expected)}, got {sorted(vectors)}")
        for start in range(0, len(docs), batch):
            points = self.new_points(docs[start:start + batch], {k: v[start:start + batch] for k, v in vectors.items()})
            self.call("upsert", lambda e: e.upsert(self.name, points))
            if progress:
                progress(len(points))
        if announce:
            self.bump()

    def delete(self, doc_ids: Sequence[str]) -> None:
        self.load_meta(force=True)  # as upsert: refuse a collection of another model before writing
        rows = self.rows_for_ids(doc_ids)  # 404 for ids not held
        self.call("delete", lambda e: e.delete(self.name, rows))
        self.bump()

    def bump(self) -> None:
        """A new generation (and version) after a write: cached answers keyed by the old one are never served
        again. Replicas racing here both write a fresh random generation, so each of their writes ends old keys."""
        meta = self.load_meta(force=True)
        update = {"version": int(meta["version"]) + 1, "generation": secrets.token_hex(8), "written_at": time.time()}
        self.call("meta", lambda e: e.set_payload(self.meta_name, META_POINT, update))
        with self._lock:
            self.meta = {**meta, **update}
            self.version = update["version"]
        self.refresh_size()
