"""The one contract the pipeline holds an index to, whichever system stores it.

Two modules implement it: the local segmented index (index/search_index.py, FAISS + Sieve's BM25 postings on this
machine's disk) and a Qdrant collection (index/qdrant_backend.py, a distributed engine). A candidate list's `rows`
are the backend's handles for its documents: live row numbers locally, point ids in Qdrant; only the backend
that produced a handle interprets it (`Outcome.index` is that backend).

A backend whose `returns_vectors` is true answers the first stages itself and returns each hit's id and vector with
it (`dense_hits`, `lexical_hits`, `both_hits`), so CMC and the evidence features need no second trip to storage;
the local index keeps its own stages (pipeline/first_stage.py), which read its memory-mapped vectors directly.
The contract test (tests/index/test_backend_contract.py) runs both backends through the same cases.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from .corpus import Document


@dataclass
class Hits:
    """One scored list, best first. rows: the backend's handles (int64); ids: document ids when the backend returns
    them with the hits; vectors: (K, d) bi-encoder vectors when it does."""

    rows: np.ndarray  # (K,) int64
    scores: np.ndarray  # (K,) float32
    ids: list[str] | None = None
    vectors: np.ndarray | None = None  # (K, d) float32

    def __post_init__(self):
        self.rows = np.asarray(self.rows, dtype=np.int64)
        self.scores = np.asarray(self.scores, dtype=np.float32)
        assert self.rows.shape == self.scores.shape, f"{self.rows.shape} rows, {self.scores.shape} scores"
        assert self.ids is None or len(self.ids) == len(self.rows), "one id per hit"
        assert self.vectors is None or self.vectors.shape[0] == len(self.rows), "one vector per hit"

    def __len__(self) -> int:
        return len(self.rows)


@runtime_checkable
class IndexBackend(Protocol):
    size: int  # live documents (a remote backend: as of its last look)
    version: int  # grows with every acknowledged write
    has_lexical: bool
    returns_vectors: bool  # True: the *_hits calls return ids and vectors, and the pipeline uses them

    def identity(self) -> str:
        """What names this index's content now (result-cache key): changes with every acknowledged write and
        differs between collections / directories."""

    def check_ready(self) -> None:
        """Raises IndexUnavailableError when the index cannot answer now."""

    # -- first stage --------------------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense top-k by inner product: (scores, rows), both (B, k')."""

    def search_lexical(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """BM25 top-k, only documents sharing a term with the query: (scores, rows), 1-D."""

    def dense_hits(self, vector: np.ndarray, k: int) -> Hits: ...

    def lexical_hits(self, query: str, k: int) -> Hits: ...

    def both_hits(self, vector: np.ndarray, query: str, depth: int) -> tuple[Hits, Hits]:
        """The dense and the BM25 top `depth` in one round trip where the backend can."""

    # -- by handle ----------------------------------------------------------------------------------------------
    def lexical_scores_of(self, query: str, rows: Sequence[int]) -> np.ndarray:
        """BM25 of the given documents (0 where none of the query's terms occurs)."""

    def embeddings(self, rows: Sequence[int], store: str | None = None) -> np.ndarray: ...

    def documents(self, rows: Sequence[int]) -> list[Document]: ...

    def ids(self, rows: Sequence[int]) -> list[str]: ...

    def rows_for_ids(self, ids: Sequence[str]) -> list[int]: ...

    def has_id(self, doc_id: str) -> bool: ...

    def has_store(self, name: str) -> bool: ...

    def close(self) -> None: ...


def hits_from(scores: np.ndarray, rows: np.ndarray) -> Hits:
    """A backend without ids or vectors in its answers (the local index): handles and scores only."""
    return Hits(rows, scores)
