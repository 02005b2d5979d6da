"""The stage contract and the three stages of the default pipeline.

A stage takes the QueryState whose candidates the previous stage ranked and returns it re-ranked; it never
reaches for HTTP, settings or globals. Candidate lists are validated at every boundary.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from models.cmc_checkpoint import CMCBundle
from models.cross_encoder import CrossEncoder
from pipeline.candidates import Candidates
from pipeline.state import QueryState


class Stage(Protocol):
    name: str

    def __call__(self, state: QueryState) -> QueryState: ...


class Retrieve:
    """Maximum inner-product search of the bi-encoder query vector over the index."""

    name = "retrieve"

    def __init__(self, index, k: int):
        self.index = index
        self.k = k

    def __call__(self, state: QueryState) -> QueryState:
        query = state.query_vectors["be"].float().cpu().numpy()[None, :]  # (1, d)
        with state.timed("mips"):
            scores, rows = self.index.search(query, self.k)
        state.candidates = Candidates(rows=rows[0], scores={"retrieve": scores[0].astype(np.float32)})
        state.counts[self.name] = len(state.candidates)
        return state


class CMCRerank:
    """Scores every candidate in the context of all the others and sorts them by that score."""

    name = "cmc"

    def __init__(self, bundle: CMCBundle, index):
        self.bundle = bundle
        self.index = index

    def candidate_vectors(self, candidates: Candidates) -> np.ndarray:
        if candidates.vectors is not None:
            return candidates.vectors
        store = "cmc" if self.bundle.config.mode == "separate" else None
        return self.index.embeddings(candidates.rows, store=store)  # (K, d)

    def __call__(self, state: QueryState) -> QueryState:
        cands = state.candidates
        state.counts[self.name] = len(cands)
        with state.timed("cmc"):
            device = self.bundle.query_tower.device
            vectors = torch.from_numpy(self.candidate_vectors(cands)).to(device)[None]  # (1, K, d)
            query = state.query_vectors["cmc"].to(device)[None]  # (1, d)
            with torch.inference_mode():
                scores = self.bundle.model(query, vectors)[0].float().cpu().numpy()  # (K,)
        state.candidates = cands.rerank_head("cmc", scores)
        state.candidates.validate()
        return state


class CrossEncoderRerank:
    """Jointly encodes (query, document) for the first `k` candidates; the rest keep their order below them."""

    name = "ce"

    def __init__(self, cross_encoder: CrossEncoder, index, k: int):
        self.cross_encoder = cross_encoder
        self.index = index
        self.k = k

    def texts(self, candidates: Candidates, n: int) -> list[str]:
        if candidates.texts is not None:
            return candidates.texts[:n]
        return [doc.full_text for doc in self.index.documents(candidates.rows[:n])]

    def __call__(self, state: QueryState) -> QueryState:
        cands = state.candidates
        n = min(self.k, len(cands))
        state.counts[self.name] = n
        with state.timed("ce"):
            scores = self.cross_encoder.score(state.query, self.texts(cands, n)).numpy()  # (n,)
        state.candidates = cands.rerank_head("ce", scores)
        state.candidates.validate()
        return state
