"""annCUR retrieval (Yadav et al. 2022) as pipeline stages: the cross-encoder itself finds the candidates.

AnnCURRetrieve ("anncur"): the cross-encoder scores the query against the k_i anchor items (its embedding e_q),
then MIPS over the annCUR index's item embeddings gives the top k by approximate cross-encoder score (column
"retrieve"). No bi-encoder is involved.
AnnCURRerank ("ce", optional, skippable): exact scores for the anchors (known already) and the best `k` other
candidates; those lead the list by exact score (column "ce"), the rest keep the approximate order below them.
Anchors the MIPS did not return are added, since their exact scores cost nothing more. Out of time, the
approximate order stands.

The annCUR index is built over the main index's rows (same corpus hash, checked by the searcher), so ids and
documents come from the request's index version. Cross-encoder work goes through the cross-encoder's batcher
(the batch key of the CE stage), so it is batched with every other request's pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sieve.index.anncur import AnnCURIndex
from sieve.models.cross_encoder import CrossEncoder
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.stages import CrossEncoderRerank
from sieve.pipeline.state import QueryState


@dataclass(frozen=True)
class AnnCUR:
    """What the searcher holds: a loaded annCUR index and the cross-encoder that built it."""

    index: AnnCURIndex
    cross_encoder: CrossEncoder


class AnnCURRetrieve:
    name = "anncur"
    skippable = False  # it produces the candidates

    def __init__(self, anncur: AnnCUR, k: int, batch_tokens: int = 8192):
        self.anncur = anncur
        self.k = k
        self.scorer = CrossEncoderRerank(anncur.cross_encoder, None, 0, batch_tokens)  # its batched compute only
        self.batch_key = self.scorer.batch_key
        self.anchor_scores: np.ndarray | None = None  # (k_i,) exact, for AnnCURRerank

    def prepare(self, state: QueryState) -> tuple:
        state.counts["ce"] = state.counts.get("ce", 0) + self.anncur.index.k_i  # cross-encoder pairs of the request
        return state.query, self.anncur.index.anchor_texts, None  # no deadline: without it there is no answer

    def compute(self, items):
        return self.scorer.compute(items)

    def finish(self, state: QueryState, anchor_scores: np.ndarray) -> QueryState:
        self.anchor_scores = np.asarray(anchor_scores, dtype=np.float32)  # (k_i,)
        with state.timed("mips"):
            scores, rows = self.anncur.index.search(self.anchor_scores, self.k)
        state.candidates = Candidates(rows=rows, scores={"retrieve": scores.astype(np.float32)})
        state.counts[self.name] = len(state.candidates)
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed(self.name):
            scores = self.compute([self.prepare(state)])[0]
        return self.finish(state, scores)


class AnnCURRerank:
    name = "ce"
    skippable = True

    def __init__(self, retrieve: AnnCURRetrieve, k: int, index, batch_tokens: int = 8192):
        self.retrieve = retrieve
        self.k = k
        self.index = index
        self.scorer = CrossEncoderRerank(retrieve.anncur.cross_encoder, index, 0, batch_tokens)
        self.batch_key = self.scorer.batch_key
        self.rows = np.empty(0, dtype=np.int64)

    def prepare(self, state: QueryState) -> tuple:
        anchors = self.retrieve.anncur.index.anchor_rows
        self.rows = state.candidates.rows[~np.isin(state.candidates.rows, anchors)][:self.k]
        state.counts["ce"] = state.counts.get("ce", 0) + len(self.rows)
        return state.query, [doc.full_text for doc in self.index.documents(self.rows)], state.deadline

    def compute(self, items):
        return self.scorer.compute(items)

    def with_anchors(self, cands: Candidates) -> Candidates:
        """The list with every anchor in it: missing ones appended with their approximate score."""
        anncur = self.retrieve.anncur.index
        missing = anncur.anchor_rows[~np.isin(anncur.anchor_rows, cands.rows)]
        if not len(missing):
            return cands
        approx = anncur.index.embeddings(missing) @ self.retrieve.anchor_scores  # (m,)
        return Candidates(rows=np.concatenate([cands.rows, missing]),
                          scores={"retrieve": np.concatenate([cands.scores["retrieve"], approx]).astype(np.float32)})

    def finish(self, state: QueryState, scores: np.ndarray) -> QueryState:
        cands = self.with_anchors(state.candidates)
        exact = dict(zip(self.retrieve.anncur.index.anchor_rows.tolist(), self.retrieve.anchor_scores.tolist()))
        exact.update(zip(self.rows.tolist(), np.asarray(scores, dtype=np.float32).tolist()))
        column = np.array([exact.get(int(r), np.nan) for r in cands.rows], dtype=np.float32)  # (K,)
        scored = np.flatnonzero(~np.isnan(column))
        order = np.concatenate([scored[np.argsort(-column[scored], kind="stable")], np.flatnonzero(np.isnan(column))])
        state.candidates = cands.with_scores("ce", column).take(order)
        state.candidates.validate()
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed(self.name):
            scores = self.compute([self.prepare(state)])[0]
        return self.finish(state, scores)


def anncur_stages(anncur: AnnCUR, k: int, rerank_k: int, index, batch_tokens: int = 8192) -> list:
    """annCUR's top k, then (rerank_k > 0) the exact rerank of the anchors and the best rerank_k others."""
    retrieve = AnnCURRetrieve(anncur, k, batch_tokens)
    return [retrieve] + ([AnnCURRerank(retrieve, rerank_k, index, batch_tokens)] if rerank_k > 0 else [])
