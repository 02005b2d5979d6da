"""The stage contract and the three stages of the default pipeline.

A stage takes the QueryState whose candidates the previous stage ranked and returns it re-ranked; it never
reaches for HTTP, settings or globals. Candidate lists are validated at every boundary.

A stage may also declare (pipeline/runner.py reads these, so deadlines and batching work for any stage):
- `skippable = True`: when it cannot finish within its time budget, the request goes on with the previous
  stage's order and says so (`partial`, `skipped`). Stages that produce the candidates are not skippable.
- a batched entry point, `batch_key` (str) plus `prepare(state) -> item`, `compute(items) -> results`,
  `finish(state, result) -> state`. `compute` does the model work for items of many requests in one go and must
  use only the stage's model, never per-request attributes: stages with the same batch_key share one batcher
  whose compute is the first instance's. A result of None means the item ran out of time inside compute.
  `__call__` is then `finish(state, compute([prepare(state)])[0])`, the unbatched path.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np
import torch

from sieve.models.cmc_checkpoint import CMCBundle
from sieve.models.cross_encoder import CrossEncoder
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.evidence import be_of, bm25_of, features
from sieve.pipeline.packing import chunks_under_budget, expired, pad_candidates, pad_lists, trim_to_longest
from sieve.pipeline.state import QueryState


class Stage(Protocol):
    name: str

    def __call__(self, state: QueryState) -> QueryState: ...


class BatchedStage(Stage, Protocol):
    batch_key: str
    skippable: bool

    def prepare(self, state: QueryState) -> Any: ...

    def compute(self, items: Sequence[Any]) -> list[Any]: ...

    def finish(self, state: QueryState, result: Any) -> QueryState: ...


class FirstStage:
    """A stage that produces the candidates (the top k of the index); never skipped for lack of time."""

    name = "retrieve"
    skippable = False

    def __init__(self, index, k: int):
        self.index = index
        self.k = k


class Retrieve(FirstStage):
    """Maximum inner-product search of the bi-encoder query vector over the index."""

    def __call__(self, state: QueryState) -> QueryState:
        query = state.query_vectors["be"].float().cpu().numpy()[None, :]  # (1, d)
        with state.timed("mips"):
            scores, rows = self.index.search(query, self.k)
        state.candidates = Candidates(rows=rows[0], scores={"retrieve": scores[0].astype(np.float32)})
        state.counts[self.name] = len(state.candidates)
        return state


class CMCRerank:
    """Scores every candidate in the context of all the others and sorts them by that score. Batched across
    queries with padding masks, at most `batch_candidates` (queries x longest list) per forward pass."""

    name = "cmc"
    skippable = True

    def __init__(self, bundle: CMCBundle, index, batch_candidates: int = 16384):
        self.bundle = bundle
        self.index = index
        self.batch_candidates = batch_candidates
        self.batch_key = f"cmc:{id(bundle.model)}"

    def candidate_vectors(self, candidates: Candidates) -> np.ndarray:
        if candidates.vectors is not None:
            return candidates.vectors
        store = "cmc" if self.bundle.config.mode == "separate" else None
        return self.index.embeddings(candidates.rows, store=store)  # (K, d)

    def prepare(self, state: QueryState) -> tuple:
        state.counts[self.name] = len(state.candidates)
        query, vectors = state.query_vectors["cmc"], self.candidate_vectors(state.candidates)
        evidence = None
        if self.bundle.config.evidence:  # a CMC that fuses first-stage evidence (pipeline/evidence.py)
            evidence = features(be_of(state.candidates, vectors, query), bm25_of(state.candidates, self.index, state.query),
                                self.bundle.config.evidence)
        return query, vectors, state.deadline, evidence

    def compute(self, items: Sequence[tuple]) -> list[np.ndarray | None]:
        results: list[np.ndarray | None] = [None] * len(items)
        device = self.bundle.query_tower.device
        for chunk in chunks_under_budget([len(item[1]) for item in items], self.batch_candidates):
            chunk = [i for i in chunk if not expired(items[i][2])]
            if not chunk:
                continue
            query, cands, mask = pad_candidates([items[i][0] for i in chunk], [items[i][1] for i in chunk], device)
            evidence = None
            if self.bundle.config.evidence:
                evidence, _ = pad_lists([items[i][3] for i in chunk], device)
            with torch.inference_mode():
                scores = self.bundle.model(query, cands, mask, evidence).float().cpu().numpy()  # (B, K)
            for b, i in enumerate(chunk):
                results[i] = scores[b, :len(items[i][1])]
        return results

    def finish(self, state: QueryState, scores: np.ndarray) -> QueryState:
        state.candidates = state.candidates.rerank_head("cmc", scores)
        state.candidates.validate()
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed("cmc"):
            return self.finish(state, self.compute([self.prepare(state)])[0])


class CrossEncoderRerank:
    """Jointly encodes (query, document) for the first `k` candidates; the rest keep their order below them.
    Batched across requests: all pairs are length-sorted and packed into forward passes of at most
    `batch_tokens` (pairs x longest pair) tokens."""

    name = "ce"
    skippable = True

    def __init__(self, cross_encoder: CrossEncoder, index, k: int, batch_tokens: int = 8192):
        self.cross_encoder = cross_encoder
        self.index = index
        self.k = k
        self.batch_tokens = batch_tokens
        self.batch_key = f"ce:{id(cross_encoder)}"

    def texts(self, candidates: Candidates, n: int) -> list[str]:
        if candidates.texts is not None:
            return candidates.texts[:n]
        return [doc.full_text for doc in self.index.documents(candidates.rows[:n])]

    def prepare(self, state: QueryState) -> tuple:
        n = min(self.k, len(state.candidates))
        state.counts[self.name] = n
        return state.query, self.texts(state.candidates, n), state.deadline

    def compute(self, items: Sequence[tuple]) -> list[np.ndarray | None]:
        if not any(texts for _, texts, _ in items):
            return [np.empty(0, dtype=np.float32) for _ in items]
        owner = [i for i, (_, texts, _) in enumerate(items) for _ in texts]  # item of each pair
        queries = [q for q, texts, _ in items for _ in texts]
        docs = [t for _, texts, _ in items for t in texts]
        ce = self.cross_encoder
        assert ce.tokenizer.padding_side == "right", "trim_to_longest cuts padding columns on the right"
        batch = ce.tokenize_pairs(queries, docs)
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        scores = np.full(len(docs), np.nan, dtype=np.float32)
        with torch.inference_mode():
            for chunk in chunks_under_budget(lengths, self.batch_tokens):
                chunk = [p for p in chunk if not expired(items[owner[p]][2])]
                if chunk:
                    scores[chunk] = ce.scorer(**trim_to_longest(batch, chunk)).float().cpu().numpy()
        out, start = [], 0
        for _, texts, _ in items:
            part = scores[start:start + len(texts)]
            out.append(None if np.isnan(part).any() else part)
            start += len(texts)
        return out

    def finish(self, state: QueryState, scores: np.ndarray) -> QueryState:
        state.candidates = state.candidates.rerank_head(self.name, scores)  # "ce", or a subclass's own name
        state.candidates.validate()
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed(self.name):
            return self.finish(state, self.compute([self.prepare(state)])[0])
