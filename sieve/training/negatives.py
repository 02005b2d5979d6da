"""Candidate lists for training from the bi-encoder (CMC paper, section 3.2 and appendix C).

Each query gets K candidates: its gold document first, then K-1 negatives of which a fraction p are the
retriever's top-ranked non-gold documents and the rest are sampled without replacement in proportion to
exp(retriever score) from the remaining non-gold documents.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MiningConfig:
    k: int = 64  # candidates per query, gold included
    hard_fraction: float = 0.5  # p: share of negatives fixed as the top-ranked ones
    temperature: float = 1.0  # sampling distribution exp(score / temperature)
    pool: int = 1024  # sampled negatives come from the retriever's top `pool` (the tail has ~zero mass)


def softmax(x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = x / temperature
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def mine_candidates(scores: np.ndarray, gold: int, positives: set[int], cfg: MiningConfig,
                    rng: np.random.Generator) -> np.ndarray:
    """scores: (N,) retriever scores of one query over the corpus -> (K,) corpus rows, gold first."""
    pool = np.argsort(-scores, kind="stable")[: cfg.pool + len(positives)]
    pool = pool[~np.isin(pool, list(positives))]  # no judged-relevant document is ever a negative
    n_neg = cfg.k - 1
    n_hard = int(round(cfg.hard_fraction * n_neg))
    hard = pool[:n_hard]
    rest = pool[n_hard:]
    n_sampled = min(n_neg - n_hard, len(rest))
    probs = softmax(scores[rest], cfg.temperature)
    sampled = rng.choice(rest, size=n_sampled, replace=False, p=probs) if n_sampled else rest[:0]
    return np.concatenate([[gold], hard, sampled]).astype(np.int64)


def top_k_rows(query_vectors: np.ndarray, doc_vectors: np.ndarray, k: int, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k for many queries, in chunks to bound memory: (Q, k) scores and rows."""
    k = min(k, len(doc_vectors))
    all_scores, all_rows = [], []
    for start in range(0, len(query_vectors), chunk):
        s = query_vectors[start:start + chunk] @ doc_vectors.T  # (q, N)
        rows = np.argpartition(-s, k - 1, axis=1)[:, :k]
        part = np.take_along_axis(s, rows, axis=1)
        order = np.argsort(-part, axis=1, kind="stable")
        all_rows.append(np.take_along_axis(rows, order, axis=1))
        all_scores.append(np.take_along_axis(part, order, axis=1))
    return np.concatenate(all_scores), np.concatenate(all_rows)


def mine_listwise(scores: np.ndarray, relevant: set[int], cfg: MiningConfig,
                  rng: np.random.Generator) -> np.ndarray | None:
    """(K,) corpus rows for the listwise objective, drawn the way serving sees candidates: all from the retriever's
    top `pool` (set it to the retrieve_k CMC reranks), a fraction p the top-ranked, the rest sampled by exp(score).
    Relevant documents are kept wherever they fall (they are labelled, not treated as negatives); when none was
    drawn, one relevant document of the pool replaces the last sampled row. None when the pool holds no relevant
    document: CMC can never move such a query's relevant documents into view, so it has nothing to learn from it.
    """
    pool = np.argsort(-scores, kind="stable")[: cfg.pool]
    in_pool = pool[np.isin(pool, list(relevant))]
    if len(in_pool) == 0:
        return None
    k = min(cfg.k, len(pool))
    n_hard = int(round(cfg.hard_fraction * k))
    hard, rest = pool[:n_hard], pool[n_hard:]
    n_sampled = min(k - n_hard, len(rest))
    sampled = rng.choice(rest, size=n_sampled, replace=False, p=softmax(scores[rest], cfg.temperature)) \
        if n_sampled else rest[:0]
    rows = np.concatenate([hard, sampled]).astype(np.int64)
    if not np.isin(rows, in_pool).any():
        rows[-1] = rng.choice(in_pool)
    return rows
