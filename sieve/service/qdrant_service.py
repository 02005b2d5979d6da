"""The service on a Qdrant collection (SIEVE_INDEX_BACKEND=qdrant: a server or the client's local mode; qdrant-edge:
the shards in this process): opening it, and the writer behind POST /documents and DELETE /documents/{id}.

Writes go straight through to Qdrant with `wait=true`, one at a time per process (sieve/index/qdrant_backend.py);
a write is acknowledged only after Qdrant acknowledged it and the collection's generation moved, so the next
search (here or on any replica) sees it and no cached answer from before it is served again. A failed write
answers 503 and acknowledges nothing (a retry of the same upsert is idempotent: point ids come from document ids).
Started while Qdrant is down, its store held by another process or not built yet, the service is up but not ready
(/readyz 503) and answers 503 until Qdrant answers; a collection of another model answers 503 index_mismatch.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from starlette.exceptions import HTTPException

from sieve.index import Document
from sieve.index.encoder import checked_embeddings
from sieve.index.errors import IndexUnavailableError
from sieve.index.qdrant_backend import QdrantIndex
from sieve.service.config import Settings

log = logging.getLogger("sieve.qdrant")


def open_qdrant(settings: Settings, biencoder) -> QdrantIndex:
    """The collection, checked against the bi-encoder when Qdrant answers; a down Qdrant is logged, not fatal."""
    index = QdrantIndex(settings.qdrant_config())
    try:
        index.check_model(settings.model_name, biencoder.weights_hash, biencoder.dim)
        index.refresh_size()
    except IndexUnavailableError as exc:
        log.warning("Qdrant is not answering yet (%s); /readyz says not ready until it does", exc)
    return index


class QdrantUpdater:
    """The same calls as service/updates.py's IndexUpdater, on a Qdrant collection. `encoders`: the bi-encoder
    ("primary") and every store a loaded stage can encode; a write encodes the stores the collection holds.
    `on_check() -> bool`: what lives beside the documents (the collection's adapted CMC, service/cmc_serving.py),
    checked on every reload and, with `poll_s`, that often by a thread of its own; True = it changed what is served."""

    def __init__(self, searcher, encoders: dict, on_write=None, on_check: Callable[[], bool] | None = None,
                 poll_s: float = 0):
        self.searcher, self.encoders, self.on_write, self.on_check = searcher, encoders, on_write, on_check
        self.lock = threading.Lock()  # one write at a time: the generation is read, then replaced
        self.check_lock = threading.Lock()  # one check at a time (a reload and the poll)
        self.closing = threading.Event()
        self.poller = threading.Thread(target=self.poll, args=(poll_s,), name="qdrant-poll", daemon=True)
        if on_check is not None and poll_s:
            self.poller.start()

    @property
    def index(self) -> QdrantIndex:
        return self.searcher.index

    def vectors(self, docs: list[Document]) -> dict:
        stores = ["primary", *(self.index.load_meta().get("stores") or {})]
        missing = [s for s in stores if s not in self.encoders]
        if missing:
            raise HTTPException(409, f"the collection holds vectors of {missing}, which this server cannot encode "
                                     "(load the stage that owns them)")
        texts = [d.full_text for d in docs]
        return {s: checked_embeddings(self.encoders[s], texts, progress=False) for s in stores}

    def result(self, upserted: int = 0, deleted: list[str] | None = None) -> dict:
        if self.on_write:
            self.on_write(self.index)
        return {"index_version": self.index.version, "index_size": self.index.size, "upserted": upserted,
                "deleted": deleted or []}

    def upsert(self, docs: list[Document], timeout_s: float | None = None, cancelled=None) -> dict:
        """Synchronous calls to Qdrant, bounded by the client's own timeout (SIEVE_WRITE_TIMEOUT_S is the local
        writer's)."""
        vectors = self.vectors(docs)  # encoded before the lock: writes encode in parallel, write one by one
        with self.lock:  # a collection rebuilt by another model: IndexMismatchError, 503 index_mismatch
            self.index.upsert(docs, vectors)
            return self.result(upserted=len(docs))

    def delete(self, doc_id: str, timeout_s: float | None = None, cancelled=None) -> dict:
        with self.lock:
            self.index.delete([doc_id])  # UnknownDocumentError (404) when the id is not held
            return self.result(deleted=[doc_id])

    def reload(self, timeout_s: float | None = None, cancelled=None) -> dict:
        """No index version to swap: every search reads Qdrant; re-read the metadata and size, and check for a newly
        published adapted CMC."""
        before = self.index.version
        self.index.check_ready()
        return {"index_version": self.index.version, "previous_version": before, "index_size": self.index.size,
                "changed": self.index.version != before, "cmc_changed": self.check()}

    def check(self) -> bool:
        if self.on_check is None:
            return False
        with self.check_lock:
            try:
                return bool(self.on_check())
            except Exception:  # noqa: BLE001 - what is served stays as it was; the next poll or reload tries again
                log.exception("checking Qdrant collection %r for a new adapted CMC failed", self.index.name)
                return False

    def poll(self, poll_s: float) -> None:
        while not self.closing.wait(poll_s):
            self.check()

    def close(self) -> None:
        self.closing.set()
