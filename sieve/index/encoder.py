"""The document-encoder protocol the index builder codes against.

The real implementation lives in models/; the index only needs the identity
fields (for manifests and cache keys) and a batch encode call.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class DocumentEncoder(Protocol):
    name: str           # e.g. "all-MiniLM-L6-v2"
    weights_hash: str   # sha256 hex of the weights: the identity of the model
    dim: int
    max_length: int     # document max tokens; changes embeddings, so part of the cache key

    def encode_documents(self, texts: Sequence[str], progress: bool = True) -> np.ndarray:
        """Return (len(texts), dim) float32 embeddings."""
        ...


def checked_embeddings(encoder: DocumentEncoder, texts: Sequence[str],
                       progress: bool) -> np.ndarray:
    """Encode and verify shape and values, so a faulty encoder cannot corrupt an index."""
    out = np.asarray(encoder.encode_documents(list(texts), progress=progress))
    expected = (len(texts), encoder.dim)
    if out.shape != expected:
        raise ValueError(f"encoder {encoder.name!r} returned shape {out.shape} for "
                         f"{len(texts)} texts; expected {expected}")
    out = np.ascontiguousarray(out, dtype=np.float32)
    if not np.isfinite(out).all():
        raise ValueError(f"encoder {encoder.name!r} returned NaN or infinite values")
    return out


def encoder_identity(encoder: DocumentEncoder) -> dict[str, object]:
    """The fields a manifest records about the model that built a store."""
    return {"model_name": encoder.name, "model_hash": encoder.weights_hash,
            "dim": int(encoder.dim)}
