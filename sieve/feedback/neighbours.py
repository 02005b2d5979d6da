"""Other users' clicks for exploration (SIEVE_FEEDBACK_EXPLORE_FROM=neighbours): the documents users of similar
queries clicked, among this query's candidates below what it shows.

Uniform exploration (ranks top_k+1..SIEVE_FEEDBACK_EXPLORE_DEPTH) rarely shows a relevant document deeper in the
list, and the click memory's nearest-queries term promotes exactly those: documents a similar query's users clicked
that this query's users never saw. Clicks cannot vouch for what was never shown, so the learner's click estimate
counts such promotions as losses (RESULTS.md, "Eighteenth session"). Showing them to this query's users in the
exploring slots lets clicks vouch for them (the memory then counts them for this query as for any shown document).

`ClickNeighbours` keeps the query vectors of the last `capacity` clicks with the clicked documents (a ring: the
oldest click goes first), in memory, per process. `promoted` scores a query's candidates: the largest cosine
between this query and a click's query, among clicks on that candidate with cosine >= near_min (0: none).
Pure arithmetic; the service feeds it (service/feedback_service.py).
"""
from __future__ import annotations

import threading

import numpy as np


class ClickNeighbours:
    def __init__(self, capacity: int, near_min: float):
        self.capacity, self.near_min = int(capacity), float(near_min)
        self.vectors: np.ndarray | None = None  # (capacity, d) float32 unit rows, allocated with the first click
        self.docs: list[str | None] = [None] * self.capacity
        self.size = self.next = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.size

    def add(self, vector, doc_id: str) -> None:
        """One click: the query's vector (any scale; a zero or wrong-sized vector is not kept) and the document."""
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(v))
        if not norm or not np.isfinite(norm):
            return
        with self.lock:
            if self.vectors is None:
                self.vectors = np.zeros((self.capacity, len(v)), dtype=np.float32)
            if len(v) != self.vectors.shape[1]:
                return
            self.vectors[self.next] = v / norm
            self.docs[self.next] = doc_id
            self.next = (self.next + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def promoted(self, vector, ids) -> np.ndarray:
        """(len(ids),) float64: for each candidate id, the largest cosine of this query with the query of a click
        on it, where that cosine is >= near_min; 0 where no such click is kept."""
        out = np.zeros(len(ids))
        if vector is None or not self.size or not len(ids):
            return out
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(v))
        with self.lock:
            if not norm or self.vectors is None or len(v) != self.vectors.shape[1]:
                return out
            sims = self.vectors[:self.size] @ (v / norm)  # (size,)
            near = np.flatnonzero(sims >= self.near_min)
            best: dict[str, float] = {}
            for j in near:
                doc, sim = self.docs[j], float(sims[j])
                if sim > best.get(doc, 0.0):
                    best[doc] = sim
        if best:
            for i, doc in enumerate(ids):
                out[i] = best.get(doc, 0.0)
        return out
