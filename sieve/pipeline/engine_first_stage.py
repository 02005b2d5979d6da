"""The first stages on an index that answers them itself (index/protocol.py `returns_vectors`: a Qdrant collection).

The same retrievers as pipeline/stages.py and pipeline/first_stage.py (be, bm25, hybrid), with the same score
columns, but each candidate comes back with its id and its bi-encoder vector, and hybrid's candidates with both
first-stage scores: CMC, the evidence features and the response need no second trip to storage. Hybrid asks for
both lists in one batch call and fuses them here, as the local hybrid does (an engine-side fused query would
return only the fused score, and the evidence features need both); BM25 of the candidates that only the dense list
found takes one more call, restricted to their ids.
"""
from __future__ import annotations

import numpy as np

from sieve.pipeline.candidates import Candidates
from sieve.pipeline.first_stage import HybridConfig, rrf_fuse
from sieve.pipeline.stages import FirstStage
from sieve.pipeline.state import QueryState


def answers_itself(index) -> bool:
    """Whether the first stages go to the index's own search calls (a remote engine) rather than local FAISS/BM25."""
    return bool(getattr(index, "returns_vectors", False))


class EngineDense(FirstStage):
    """be: the engine's dense top k, with vectors."""

    def __call__(self, state: QueryState) -> QueryState:
        vector = state.query_vectors["be"].float().cpu().numpy()  # (d,)
        with state.timed("mips"):
            hits = self.index.dense_hits(vector, max(self.k, 1))
        state.candidates = Candidates(rows=hits.rows, scores={"retrieve": hits.scores}, vectors=hits.vectors,
                                      ids=hits.ids)
        state.counts[self.name] = len(hits)
        return state


class EngineLexical(FirstStage):
    """bm25: the engine's BM25 top k (documents sharing a term with the query), with vectors."""

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed("bm25"):
            hits = self.index.lexical_hits(state.query, max(self.k, 1))
        if len(hits) == 0:
            state.warnings.append("no indexed document shares a term with the query (BM25 found nothing)")
        state.candidates = Candidates(rows=hits.rows, scores={"retrieve": hits.scores, "bm25": hits.scores},
                                      vectors=hits.vectors, ids=hits.ids)
        state.counts["bm25"] = len(hits)
        return state


class EngineHybrid(FirstStage):
    """hybrid: both top `depth` (default k) lists in one call, fused by reciprocal rank here; every candidate gets both scores."""

    def __init__(self, index, k: int, config: HybridConfig = HybridConfig()):
        super().__init__(index, k)
        self.config = config

    def __call__(self, state: QueryState) -> QueryState:
        depth = max(self.config.depth or self.k, 1)  # unset: the top k of each list, as HybridRetrieve
        vector = state.query_vectors["be"].float().cpu().numpy()  # (d,)
        with state.timed("mips"):  # one round trip: the dense and the BM25 list
            dense, lexical = self.index.both_hits(vector, state.query, depth)
        with state.timed("fuse"):
            rows, fused = rrf_fuse([dense.rows, lexical.rows], [self.config.weight_be, self.config.weight_bm25],
                                   self.config.rrf_k)
            rows, fused = rows[:max(self.k, 1)], fused[:max(self.k, 1)]
            where = {r: (dense, i) for i, r in enumerate(dense.rows.tolist())}
            where.update({r: (lexical, i) for i, r in enumerate(lexical.rows.tolist())})
            vectors = np.stack([where[r][0].vectors[where[r][1]] for r in rows.tolist()]) if len(rows) else \
                np.empty((0, len(vector)), np.float32)  # (K, d)
            ids = [where[r][0].ids[where[r][1]] for r in rows.tolist()]
            be = (vectors @ vector).astype(np.float32)  # (K,)
        with state.timed("bm25"):  # the BM25 of candidates only the dense list found: a call filtered to their ids
            bm25 = self.bm25_of(state.query, rows, lexical)
        state.counts["bm25"] = len(lexical)
        state.candidates = Candidates(rows=rows, scores={"retrieve": fused, "be": be, "bm25": bm25}, vectors=vectors,
                                      ids=ids)
        state.counts["retrieve"] = len(rows)
        return state

    def bm25_of(self, query: str, rows: np.ndarray, lexical) -> np.ndarray:
        """Each candidate's BM25: from the BM25 list, else one call restricted to the candidates it did not hold
        (0 for those sharing no term with the query), as the local hybrid scores every candidate."""
        known = dict(zip(lexical.rows.tolist(), lexical.scores.tolist()))
        out = np.array([known.get(r, 0.0) for r in rows.tolist()], dtype=np.float32)
        missing = [i for i, r in enumerate(rows.tolist()) if r not in known]
        if missing and len(lexical):  # an empty BM25 list: no candidate shares a term with the query
            out[missing] = self.index.lexical_scores_of(query, rows[missing])
        return out
