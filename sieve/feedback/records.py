"""The impression record: what one /search answer showed and what the learner needs to rank its candidates again.

    request_id   the answer's id (POST /feedback names it)
    t            unix time
    query_key    sha256 of the normalised query (joins an answer served from the result cache to a full record)
    query        the text, only with SIEVE_FEEDBACK_LOG_QUERY_TEXT
    shown        ids in the order displayed (after a randomised swap, if any)
    swap         1-based position p when results p and p+1 were swapped for position-bias estimation, else None
    vector       the query vector CMC read (base64 float32), absent for a cached answer
    candidates   the first SIEVE_FEEDBACK_LOG_CANDIDATES first-stage candidates in first-stage order (ids)
    be, bm25     their bi-encoder and BM25 scores (base64 float32): the evidence features are recomputed from them
"""
from __future__ import annotations

import base64
import hashlib

import numpy as np


def pack(values) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype=np.float32).tobytes()).decode()


def unpack(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.float32)


def query_key(normalised_query: str) -> str:
    return hashlib.sha256(normalised_query.encode()).hexdigest()[:32]


def first_stage(outcome, depth: int) -> dict:
    """The candidates CMC ranked, back in first-stage order (by the retriever's `retrieve` score, stable), with
    the raw evidence CMC's features are computed from; {} when the answer has no index candidates."""
    cands = outcome.state.candidates
    if cands is None or not len(cands) or "retrieve" not in cands.scores or (cands.rows < 0).any():
        return {}
    order = np.argsort(-np.nan_to_num(cands.scores["retrieve"], nan=-np.inf), kind="stable")[:depth]
    ids = [cands.ids[i] for i in order] if cands.ids is not None else outcome.index.ids(cands.rows[order])
    missing = np.zeros(len(order), np.float32)
    be = cands.scores.get("be", missing)
    bm25 = cands.scores.get("bm25", missing)
    vectors = outcome.state.query_vectors
    vector = vectors.get("cmc", vectors.get("be"))
    out = {"candidates": list(ids), "be": pack(np.nan_to_num(np.asarray(be)[order]) if len(be) == len(cands) else missing),
           "bm25": pack(np.nan_to_num(np.asarray(bm25)[order]) if len(bm25) == len(cands) else missing)}
    if vector is not None:
        out["vector"] = pack(vector.detach().float().cpu().numpy().reshape(-1))
    return out
