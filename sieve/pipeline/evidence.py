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
    are computed; the two rank columns come together). Finite float32 scores, what the stages give, take a
    shortcut to the same numbers bit for bit (tests/pipeline/test_evidence_numbers.py); any other scores are
    computed column by column."""
    be, bm25 = np.asarray(be), np.asarray(bm25)
    if (be.dtype == bm25.dtype == np.float32 and be.ndim == 1 and be.shape == bm25.shape and 0 < len(be) < 1 << 28
            and 0 <= n <= len(FEATURES)):
        both = np.empty((2, len(be)))  # (2, K) float64: be, bm25
        both[0], both[1] = be, bm25
        sums = np.add.reduce(both, axis=1, keepdims=True)  # (2, 1): each row's sum as its 1-D sum (pairwise)
        if np.isfinite(sums).all():  # then so is every score (float32s cannot overflow a float64 sum)
            return _finite_float32_features(both, sums, n)
    return _features_by_column(be, bm25, n)


# A float32 score as a float64 leaves the low 29 bits of its mantissa zero: a sort key made of its bits can carry
# the candidate's position there, and one plain sort of those unique keys orders by score, ties by position, as
# the stable argsort does (10 us for both lists against 14 for two stable argsorts of 512).
_POSITION_BITS = 29
_MAGNITUDE = np.int64(0x7FFF_FFFF_FFFF_FFFF)


@lru_cache(maxsize=64)
def _rank_constants(k: int) -> tuple[np.ndarray, np.ndarray]:
    """For lists of k: the flat position of each (row, candidate) of a (2, k) array, and the prior twice."""
    positions = np.arange(2 * k, dtype=np.int64).reshape(2, k)
    priors = np.tile(position_prior(k), (2, 1))
    positions.flags.writeable = priors.flags.writeable = False
    return positions, priors


def _finite_float32_features(both: np.ndarray, sums: np.ndarray, n: int) -> np.ndarray:
    """features() of finite float32 scores; both: (be, bm25) as float64 rows, sums: their (2, 1) row sums. The
    float64 operations of the column-by-column path, each taken for both rows at once (the same IEEE results),
    into float64 rows converted to float32 in one pass at the end."""
    k = both.shape[1]
    cols = np.empty((max(n, 3), k))  # (n, K) float64: the features in order (3 rows at least: ranks come in two)
    cols[0] = position_prior(k)
    if n > 1:  # be_rank, bm25_rank: -log(1 + rank), rank by score descending, ties in order of appearance
        positions, priors = _rank_constants(k)
        bits = both.view(np.int64)
        magnitude = bits & _MAGNITUDE  # the sign dropped: -0.0 and 0.0 share a key, as they compare equal
        keys = np.where(bits < 0, magnitude, -magnitude)  # ascending keys = descending scores
        keys += positions  # into the zero low bits: unique keys, ties ordered by position
        keys.sort(axis=1)
        cols[1:3].reshape(-1)[keys & ((1 << _POSITION_BITS) - 1)] = priors
    if n > 3:
        cols[3] = both[0]
    if n > 4:  # BM25 / the largest, 0 if none is positive (bm25.max(initial=0) as the column path takes it)
        top = both[1].max()
        if top > 0:
            np.divide(both[1], top, out=cols[4])
        else:
            cols[4] = 0.0
    if n > 5:
        np.greater(both[1], 0, out=cols[5])
    if n > 6:  # be_z, bm25_z: standardised() of each row, 0 for a row whose std is 0
        deviations = both - sums / k
        std = np.sqrt(np.add.reduce(deviations * deviations, axis=1, keepdims=True) / k)  # (2, 1)
        if std.all():
            np.divide(deviations[:n - 6], std[:n - 6], out=cols[6:])
        else:
            cols[6:] = np.where(std > 0, deviations / np.where(std > 0, std, 1.0), 0.0)[:n - 6]
    out = np.empty((k, n), dtype=np.float32)
    out[...] = cols[:n].T  # float64 -> float32 as astype rounds
    return out


def _features_by_column(be: np.ndarray, bm25: np.ndarray, n: int) -> np.ndarray:
    """features(), each column as its own function computes it (any dtype, NaN and infinite scores included)."""
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


def be_of(candidates, vectors: np.ndarray | None, query_vector, inner: str | None = None) -> np.ndarray:
    """The candidates' bi-encoder inner products: the hybrid stage's "be" column, else the column `inner` (the `be`
    retriever's scores, where the caller knows they are these products: Candidates.inner_products), else
    vectors @ query."""
    if "be" in candidates.scores:
        return candidates.scores["be"]
    if inner is not None:
        return candidates.scores[inner]
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
