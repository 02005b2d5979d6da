"""Content-addressed embedding cache: encoding a corpus takes minutes, loading seconds."""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Sequence

import numpy as np

from .corpus import hash_strings
from .encoder import DocumentEncoder, checked_embeddings


def cache_key(encoder: DocumentEncoder, texts: Sequence[str]) -> str:
    """sha256 over model identity, document max length, the precision the documents are encoded in (when not
    fp32: keys made before it are fp32's) and the exact texts."""
    precision = getattr(encoder, "doc_precision", "fp32")
    parts = [encoder.name, encoder.weights_hash, str(encoder.max_length), *([] if precision == "fp32" else [precision]),
             hash_strings(texts)]
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()


def cache_file(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / "embeddings" / f"{key}.npy"


def _load_hit(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
    try:
        arr = np.load(path)
    except (OSError, ValueError):
        return None  # missing or corrupt: treat as a miss and overwrite
    if arr.shape != shape or arr.dtype != np.float32:
        return None
    return arr


def _save_atomic(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, arr)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def encode_cached(encoder: DocumentEncoder, texts: Sequence[str],
                  cache_dir: Path | None, progress: bool) -> np.ndarray:
    """Embeddings for `texts`, from the cache when present; None disables caching."""
    if cache_dir is None:
        return checked_embeddings(encoder, texts, progress)
    path = cache_file(Path(cache_dir), cache_key(encoder, texts))
    hit = _load_hit(path, (len(texts), encoder.dim))
    if hit is not None:
        return hit
    emb = checked_embeddings(encoder, texts, progress)
    _save_atomic(path, emb)
    return emb
