"""Pieces the stage modules share: a model's identity for the cache fingerprint, the lexical check."""
from __future__ import annotations

from sieve.pipeline.errors import StageUnavailable


def model_identity(model) -> list | None:
    """Name, weights and token lengths of a model that can answer a request; None where it is not loaded."""
    if model is None:
        return None
    lengths = getattr(model, "lengths", None)
    return [getattr(model, "name", None), getattr(model, "weights_hash", None), repr(lengths) if lengths else None]


def require_lexical(index):
    if not getattr(index, "has_lexical", False):
        raise StageUnavailable("this index has no lexical (BM25) part", field="retriever",
                               allowed="be (the operator rebuilds the index with `sieve index build`, which "
                                       "adds BM25 unless --no-lexical)")
    return index
