"""The served click memory (sieve/feedback/memory.py): loaded from the served index's store at start-up and swapped
live when `sieve feedback learn` publishes a new one (checked with the adapted CMC on every reload and poll, in the
index writer thread of each worker process). The new memory is loaded in that thread and put in place with one
reference assignment (Searcher.memory); only then is the result-cache fingerprint recomputed (on_swap), so no answer
ranked without it is stored under the new fingerprint. Off with SIEVE_CLICK_MEMORY_ENABLED=false, and on a
Qdrant-backed server (the store lives in a local index directory)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from sieve.feedback.memory import ClickMemory
from sieve.feedback.memory_store import MemoryStore

log = logging.getLogger("sieve")


class ServedMemory:
    def __init__(self, settings, searcher, on_swap: Callable[[], None] = lambda: None):
        self.searcher, self.on_swap = searcher, on_swap
        self.enabled = settings.click_memory_enabled and not settings.on_qdrant
        self.store = MemoryStore(settings.index_dir)
        self.watched: Path | None = None
        if self.enabled:
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a damaged memory must not stop the server; the next check retries
                log.exception("could not load the click memory of %s", settings.index_dir)

    def check(self) -> bool:
        """Swap in the live memory when it changed since the last look; True = swapped."""
        if not self.enabled:
            return False
        current = self.store.current()
        if current == self.watched:
            return False
        self.watched = current  # one that cannot be read is passed over once, not on every poll
        fresh = ClickMemory.load(current) if current is not None else None
        self.searcher.memory = fresh
        self.on_swap()
        log.info("click memory -> %s (%d entries)", current, len(fresh) if fresh else 0)
        return True

    def status(self) -> dict | None:
        """/readyz `click_memory`: the served memory's version, weights and size (null: none served)."""
        memory = getattr(self.searcher, "memory", None)
        if memory is None:
            return None
        return {"version": memory.version, "w_query": memory.w_query, "w_doc": memory.w_doc,
                "w_near": memory.w_near, "near_min": memory.near_min, "near_k": memory.near_k,
                "doc_gate": memory.doc_gate, "doc_related": memory.doc_related, "pseudo": memory.pseudo,
                "queries": len(memory.pairs), "documents": len(memory.docs)}
