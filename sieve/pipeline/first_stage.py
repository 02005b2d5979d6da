"""Lexical and hybrid first stages: BM25 alone, and BM25 fused with the bi-encoder by reciprocal rank.

Every candidate of a hybrid list carries both first-stage scores, not only those of the lists it came from
(BM25 scores every row at once; the bi-encoder's inner product is one dot product with the stored vector), so a
later stage sees complete evidence; it carries that stored vector too, which CMC reads from the candidate. Where
the vector search scored every row anyway (a batch searched by torch's matrix product on the CPU:
pipeline/dense_batch.py), the inner products are read from those scores and no vector is read here: CMC's runner
gathers the candidates' vectors straight into its batch (pipeline/packing.py), one copy per request instead of two.
Columns: "retrieve" = the score this stage ranked by (BM25, or the fused RRF score), "be" = bi-encoder inner
product, "bm25" = BM25 score.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sieve.index.lexical import row_numbers, top_positive
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.dense_batch import search_dense_scored
from sieve.pipeline.stages import FirstStage
from sieve.pipeline.state import QueryState

RRF_K = 60


@dataclass(frozen=True)
class HybridConfig:
    depth: int | None = None  # top N taken from each list before fusion; None = the stage's k (retrieve_k)
    rrf_k: float = RRF_K
    weight_be: float = 1.0  # weighted RRF: each list's 1 / (k + rank) is multiplied by its weight
    weight_bm25: float = 1.0


def rrf_fuse(lists: list[np.ndarray], weights: list[float], k: float = RRF_K,
             size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion of ranked row lists (best first): sum of weight / (k + rank), rank from 1.
    Returns (rows, fused scores) best first; ties keep the order of first appearance (list 0 first).
    `size`: every row is below it (an index's rows): the sums go to an array of that size instead of through a sort
    of all rows (the same result, the same float sums; 126 -> 88 us for lists of 512 and 400 over 5,183 rows)."""
    every = np.concatenate([np.asarray(rows, dtype=np.int64) for rows in lists])  # (N,) all lists, list 0 first
    shares = _shares(tuple(map(float, weights)), float(k), tuple(len(rows) for rows in lists))  # (N,)
    if size is not None and len(every) and every.view(np.uint64).max() < size:  # as uint64 a negative row is huge
        return _fuse_by_row(every, shares, size)
    rows, first, owner = np.unique(every, return_index=True, return_inverse=True)
    scores = np.bincount(owner.ravel(), weights=shares, minlength=len(rows))  # (U,) summed in list order
    order = np.lexsort((first, -scores))  # best first; ties in order of first appearance
    return rows[order], scores[order].astype(np.float32)


def _fuse_by_row(every: np.ndarray, shares: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    position = row_numbers(len(every))
    first = np.full(size, len(every))  # (size,) each row's first position in `every`
    np.minimum.at(first, every, position)
    rows = every[first[every] == position]  # (U,) each row once, in order of first appearance
    scores = np.bincount(every, weights=shares, minlength=size)[rows]  # summed in list order, as np.add.at sums
    # Best first, ties in that order, by one plain sort of unique int64 keys (~6 us against ~15 for the stable
    # argsort of ~900 float64 scores): a positive float64 orders as its bits, inverted here so the best come
    # first; the low bits give way to the position. Scores that differ only in those bits (equal sums of
    # different shares, one rounding apart) then come in position order, which a check finds and a stable sort of
    # the nearly sorted list mends (equal scores stay in position order); so do 0 and negative scores. NaN, whose
    # bits give no order, takes the stable argsort of all, as before.
    low = (1 << len(rows).bit_length()) - 1
    keys = np.invert(scores.view(np.int64))
    keys &= ~low
    keys |= position[:len(rows)]
    keys.sort()
    order = keys & low
    ranked = scores[order]
    if not (ranked[:-1] >= ranked[1:]).all():
        order = np.argsort(-scores, kind="stable") if np.isnan(ranked).any() else \
            order[np.argsort(-ranked, kind="stable")]
        ranked = scores[order]
    return rows[order], ranked.astype(np.float32)


@lru_cache(maxsize=64)
def _shares(weights: tuple[float, ...], k: float, lengths: tuple[int, ...]) -> np.ndarray:
    """(N,) weight / (k + rank) of every list's ranks, list 0 first (read-only; the same for most requests)."""
    shares = np.concatenate([weight / (k + np.arange(1, n + 1, dtype=np.float64))
                             for n, weight in zip(lengths, weights)])
    shares.flags.writeable = False
    return shares


class LexicalRetrieve(FirstStage):
    """BM25 over the index's lexical part. Only documents sharing a term with the query are returned."""

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed("bm25"):
            scores, rows = self.index.search_lexical(state.query, self.k)
        if len(rows) == 0:
            state.warnings.append("no indexed document shares a term with the query (BM25 found nothing)")
        state.candidates = Candidates(rows=rows, scores={"retrieve": scores, "bm25": scores})
        state.counts["bm25"] = len(rows)
        return state


class HybridRetrieve(FirstStage):
    """The bi-encoder's and BM25's top `depth` each (default: k each), fused by reciprocal rank; the top k of the
    union in fused order. `dense`: the vector search, batched across requests (pipeline/dense_batch.py); None:
    the index's own search, alone."""

    def __init__(self, index, k: int, config: HybridConfig = HybridConfig(), dense=None):
        super().__init__(index, k)
        self.config = config
        self.dense = dense

    def depth(self) -> int:
        return min(max(self.config.depth or self.k, 1), self.index.size)

    def dense_want(self):
        """The vector search this stage will make, for the query encoder's runner to make with the encoding
        (pipeline/dense_batch.py)."""
        return None if self.dense is None else self.dense.want(self.index, self.depth())

    def __call__(self, state: QueryState) -> QueryState:
        depth = self.depth()
        vector = state.query_vectors["be"].float().cpu().numpy()  # (d,)
        with state.timed("mips"):
            _, dense_rows, every = search_dense_scored(self.dense, self.index, vector, depth, state)
        with state.timed("bm25"):
            all_bm25 = self.index.lexical_scores(state.query)
            _, bm25_rows = top_positive(all_bm25, depth)
        with state.timed("fuse"):
            rows, fused = rrf_fuse([dense_rows, bm25_rows], [self.config.weight_be, self.config.weight_bm25],
                                   self.config.rrf_k, size=self.index.size)
            rows, fused = rows[:self.k], fused[:self.k]
            if every is not None:  # the vector search scored every row: no vector read here (CMC reads them itself)
                vectors, be = None, every[rows]
            else:
                vectors = self.index.embeddings(rows)  # (k, d): carried on, so CMC does not read them again
                be = (vectors @ vector).astype(np.float32)
        state.counts["bm25"] = len(bm25_rows)
        state.candidates = Candidates(rows=rows, scores={"retrieve": fused, "be": be, "bm25": all_bm25[rows]},
                                      vectors=vectors)
        state.counts["retrieve"] = len(rows)
        return state

