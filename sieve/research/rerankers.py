"""Two more rerank stages (issue 5), on the stage contract of pipeline/stages.py.

- MixRerank: the MixEncoder over the candidates' context embeddings, read from the index store "mix" (computed
  offline) or, for /rerank texts that are not indexed, encoded on the fly. One query encoding per request.
- LateCrossEncoderRerank: a cross-encoder stage under the name "ce_late", so a cls+late cross-encoder can serve
  beside the plain one and each request picks which scores the head of the list.

Both are batched stages: their model work runs on the model's batch worker (pipeline/batching.py), so the
tokenizer is used from one thread at a time when batching is on, and through its lock when it is off.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sieve.models.cross_encoder import CrossEncoder
from sieve.research.mix.runtime import STORE, MixRuntime
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.packing import expired
from sieve.pipeline.stages import CrossEncoderRerank
from sieve.pipeline.state import QueryState


class MixRerank:
    """Scores the first `k` candidates (all when k is None) with the MixEncoder and sorts them by that score; the
    rest keep their order below them."""

    name = "mix"
    skippable = True

    def __init__(self, mix: MixRuntime, index, k: int | None = None):
        self.mix = mix
        self.index = index
        self.k = k
        self.batch_key = f"mix:{id(mix)}"

    def contexts(self, cands: Candidates, n: int) -> tuple[np.ndarray, list[int], list[str]]:
        """(n, k * d) stored context embeddings; the positions (and texts) of candidates not in the index, whose
        rows are left to compute()."""
        rows = cands.rows[:n]
        out = np.zeros((n, self.mix.dim), dtype=np.float32)
        known = np.flatnonzero(rows >= 0)
        if len(known):
            out[known] = self.index.embeddings(rows[known], store=STORE)
        fresh = np.flatnonzero(rows < 0).tolist()
        return out, fresh, [cands.texts[i] for i in fresh] if fresh else []

    def prepare(self, state: QueryState) -> tuple:
        n = len(state.candidates) if self.k is None else min(self.k, len(state.candidates))
        contexts, fresh, texts = self.contexts(state.candidates, n)
        state.counts[self.name] = n
        if fresh:
            state.counts["candidate_encode"] = len(fresh)
        return state.query, contexts, fresh, texts, state.deadline

    def compute(self, items: Sequence[tuple]) -> list[np.ndarray | None]:
        """One query encoding per item; candidates without stored contexts are encoded here, on the worker."""
        results: list[np.ndarray | None] = []
        for query, contexts, fresh, texts, deadline in items:
            if expired(deadline):
                results.append(None)
                continue
            if fresh:
                contexts = contexts.copy()
                contexts[fresh] = self.mix.encode_documents(texts, progress=False)
            results.append(self.mix.score_states(self.mix.query_states(query), contexts))
        return results

    def finish(self, state: QueryState, scores: np.ndarray) -> QueryState:
        state.candidates = state.candidates.rerank_head(self.name, scores)
        state.candidates.validate()
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed(self.name):
            return self.finish(state, self.compute([self.prepare(state)])[0])


class LateCrossEncoderRerank(CrossEncoderRerank):
    """The cross-encoder stage for a second cross-encoder (a gated+late or cls+late checkpoint), scored under "ce_late"."""

    name = "ce_late"

    def __init__(self, cross_encoder: CrossEncoder, index, k: int, batch_tokens: int = 8192):
        super().__init__(cross_encoder, index, k, batch_tokens)
        self.batch_key = f"ce_late:{id(cross_encoder)}"
