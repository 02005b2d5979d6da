"""First-stage evidence per candidate, for a CMC that fuses it (models/cmc.py `Evidence`).

The same function builds the features at serving time (pipeline/stages.py) and in training (training/fusion.py),
so a model never sees features computed differently from the ones it learned on. Features, per candidate of a
list in first-stage order:
  prior      -log(1 + position in the first stage's order): the order CMC starts from
  be_rank    -log(1 + rank by the inner product of the query and candidate vectors within the list)
  bm25_rank  -log(1 + rank by BM25 within the list)
  be         the inner product itself
  bm25_norm  BM25 / the list's largest BM25 (0 when no candidate shares a term with the query)
  bm25_hit   1 when the candidate shares a term with the query
  be_z       the inner product standardised within the list (mean 0, std 1)
  bm25_z     BM25 standardised within the list
A model trained on the first n features is given the first n (later features are appended, never inserted).
BM25 comes from the candidates' "bm25" column when the first stage computed it, else from the index's lexical
part (index/protocol.py `lexical_scores_of`: a Qdrant collection answers it for the candidates' ids); texts outside the index (/rerank) and indexes without a lexical part have no BM25 evidence (zeros).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

FEATURES = ("prior", "be_rank", "bm25_rank", "be", "bm25_norm", "bm25_hit", "be_z", "bm25_z")


@lru_cache(maxsize=64)
def position_prior(k: int) -> np.ndarray:
    """-log(1 + position) for positions 0..k-1 (read-only; one array per list length, shared by requests)."""
    prior = -np.log1p(np.arange(k, dtype=np.float64))
    prior.flags.writeable = False
    return prior


def rank_feature(values: np.ndarray) -> np.ndarray:
    """-log(1 + rank), rank 0 for the largest value; ties share the order of appearance."""
    out = np.empty(len(values), dtype=np.float64)
    out[np.argsort(-values, kind="stable")] = position_prior(len(values))
    return out


def standardised(values: np.ndarray) -> np.ndarray:
    """(values - mean) / std (0 where std is 0): numpy's mean and std, each step as numpy takes it (the same
    float results, tests/pipeline/test_evidence.py), the deviations computed once."""
    if not len(values):
        return np.zeros_like(values)
    deviations = values - values.mean()
    std = np.sqrt(np.multiply(deviations, deviations).sum() / len(values))
    return deviations / std if std > 0 else np.zeros_like(values)


def features(be: np.ndarray, bm25: np.ndarray, n: int = len(FEATURES)) -> np.ndarray:
    """be, bm25: (K,) scores of a list in first-stage order -> (K, n) float32: the first n of FEATURES (only those
    are computed)."""
    be, bm25 = np.asarray(be, dtype=np.float64), np.asarray(bm25, dtype=np.float64)
    if not np.isfinite(bm25).all():
        bm25 = np.nan_to_num(bm25)
    top = bm25.max(initial=0.0)
    columns = (lambda: position_prior(len(be)), lambda: rank_feature(be), lambda: rank_feature(bm25), lambda: be,
               lambda: bm25 / top if top > 0 else np.zeros_like(bm25), lambda: bm25 > 0,
               lambda: standardised(be), lambda: standardised(bm25))
    out = np.empty((len(be), n), dtype=np.float32)  # (K, n)
    for j, column in enumerate(columns[:n]):
        out[:, j] = column()  # float64 -> float32 as astype rounds
    return out


def be_of(candidates, vectors: np.ndarray, query_vector) -> np.ndarray:
    """The candidates' bi-encoder inner products: the hybrid stage's "be" column, else vectors @ query."""
    if "be" in candidates.scores:
        return candidates.scores["be"]
    return vectors @ query_vector.float().cpu().numpy()


def bm25_of(candidates, index, query: str) -> np.ndarray:
    """The candidates' BM25 scores: their own column, else the index's lexical part, else zeros."""
    if "bm25" in candidates.scores:
        return candidates.scores["bm25"]
    out = np.zeros(len(candidates), dtype=np.float32)
    indexed = candidates.rows >= 0
    if getattr(index, "has_lexical", False) and indexed.any():
        out[indexed] = index.lexical_scores_of(query, candidates.rows[indexed])
    return out
