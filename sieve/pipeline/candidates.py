"""The one record that flows through every stage: a column-wise candidate list in ranked order."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sieve.pipeline import registry



@dataclass
class Candidates:
    """K candidates in their current ranked order.

    rows: index rows (int64), -1 for texts that are not in the index (/rerank).
    scores: stage name -> (K,) float32; a stage that did not score a candidate holds NaN there.
    vectors: (K, d) candidate vectors for texts not in the index (None when all rows are indexed).
    texts: candidate texts when the caller supplied them (/rerank), else fetched from the index on demand.
    origin: position of each candidate in the caller's input (/rerank answers with it).
    ids: document ids when the index returned them with the hits (a remote engine: sieve/index/protocol.py), else
        None and the index maps rows to ids.
    vector_store: the store `vectors` came from (None = the bi-encoder's, "cmc" = a separate-mode CMC's).
    inner_products: the score column that holds each candidate's inner product with the bi-encoder's query vector
        besides a "be" column (the `be` retriever's "retrieve": its search scores), so a later stage that needs them
        reads them there instead of the candidates' vectors; None where no column does.
    """

    rows: np.ndarray
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    vectors: np.ndarray | None = None
    texts: list[str] | None = None
    origin: np.ndarray | None = None
    ids: list[str] | None = None
    vector_store: str | None = None
    inner_products: str | None = None

    def __post_init__(self):
        self.rows = np.asarray(self.rows, dtype=np.int64)
        if self.origin is None:
            self.origin = np.arange(len(self.rows))
        self.validate()

    def __len__(self) -> int:
        return len(self.rows)

    def validate(self) -> None:
        """Checked at every stage boundary: every column has one entry per candidate."""
        n = len(self.rows)
        assert self.rows.ndim == 1, f"rows must be 1-D, got {self.rows.shape}"
        known = registry.score_keys()
        for stage, values in self.scores.items():
            assert stage in known, f"score column {stage!r} is no registered stage's"
            assert values.shape == (n,), f"{stage} scores {values.shape} != ({n},)"
        assert self.vectors is None or self.vectors.shape[0] == n, "one vector per candidate"
        assert self.texts is None or len(self.texts) == n, "one text per candidate"
        assert len(self.origin) == n, "one origin per candidate"
        assert self.ids is None or len(self.ids) == n, "one id per candidate"

    def take(self, order: np.ndarray) -> "Candidates":
        """A new list holding the candidates at `order`, in that order."""
        order = np.asarray(order, dtype=np.int64)
        return Candidates(
            rows=self.rows[order],
            scores={k: v[order] for k, v in self.scores.items()},
            vectors=None if self.vectors is None else self.vectors[order],
            texts=None if self.texts is None else [self.texts[i] for i in order],
            origin=self.origin[order],
            ids=None if self.ids is None else [self.ids[i] for i in order],
            vector_store=self.vector_store,
            inner_products=self.inner_products,
        )

    def with_scores(self, stage: str, values: np.ndarray) -> "Candidates":
        scores = dict(self.scores)
        scores[stage] = np.asarray(values, dtype=np.float32)
        return Candidates(self.rows, scores, self.vectors, self.texts, self.origin, self.ids, self.vector_store,
                          self.inner_products)

    def rerank_head(self, stage: str, head_scores: np.ndarray) -> "Candidates":
        """Score the first len(head_scores) candidates with `stage`, sort them by it, keep the tail in its order."""
        n = len(head_scores)
        column = np.full(len(self), np.nan, dtype=np.float32)
        column[:n] = head_scores
        scored = self.with_scores(stage, column)
        order = np.concatenate([np.argsort(-column[:n], kind="stable"), np.arange(n, len(self))])
        return scored.take(order)


def ranked_scores(scores: dict) -> np.ndarray:
    """The `score` of each candidate in rank order, never increasing down the list. Each candidate gets the score
    of the last stage that scored it (the cross-encoder scores only the head); a run of candidates below a later
    stage's cut-off keeps its own stage's scores, shifted down when needed so that its highest is one below the
    lowest score above it (the gaps between its scores kept). Each stage's raw score stays in `scores`."""
    columns = [np.asarray(v, dtype=np.float64) for c, v in scores.items() if c in registry.ranking_keys()]
    assert columns, "every candidate has a retrieve score"
    if np.isfinite(columns[-1]).all():  # the last stage scored every candidate: one run, what the loop below gives
        return np.minimum.accumulate(columns[-1])
    table = np.stack(columns)  # (stages, K)
    owner = np.where(~np.isnan(table), np.arange(len(columns))[:, None], -1).max(axis=0)  # (K,) last stage
    assert (owner >= 0).all(), "every candidate has a retrieve score"
    raw = table[owner, np.arange(table.shape[1])]  # (K,)
    out, floor, start = raw.copy(), math.inf, 0
    for end in [*np.flatnonzero(np.diff(owner)) + 1, len(raw)]:  # runs of candidates owned by one stage
        run = out[start:end]
        if run.max() >= floor:
            run -= run.max() - floor + 1.0
        out[start:end] = np.minimum.accumulate(np.minimum(run, floor))  # never up, even within a run
        floor, start = out[end - 1], end
    return out
