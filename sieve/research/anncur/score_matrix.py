"""Exact cross-encoder scores of many queries against many documents, computed in resumable chunks.

This is the expensive part of annCUR (R_anc: k_q anchor queries x every document) and of its evaluation (the
test queries' exact scores, the ground truth). A work directory holds `plan.json` (what is being scored: the
model's identity and pair lengths, hashes of the query and document texts), one `chunk_NNNNN.npy` per block of
queries, written atomically, and `timing.json` (pairs scored and seconds spent, summed over every invocation).
An interrupted run resumes at the first missing chunk; a work directory made for other inputs is refused.

With `parts=True` a sum-of-parts cross-encoder (gated: the [CLS] logit and the pooled cosine, each trained with its
own loss) is scored once for all its parts: (Q, N, P) scores, P in the scorer's `part_names` order, whose sum over
the last axis is the model's score; the plan then records the part names.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
from tqdm.auto import tqdm

from sieve.index.corpus import hash_strings

FORMAT_VERSION = 1


class PairScorer(Protocol):
    """What is needed of a cross-encoder (models.cross_encoder.CrossEncoder fits)."""

    name: str
    weights_hash: str

    def score(self, query: str, documents: Sequence[str]): ...  # (N,) scores


def scorer_identity(scorer) -> dict:
    """The fields that change the scores: weights, variant and pair lengths."""
    lengths = getattr(scorer, "lengths", None)
    module = getattr(scorer, "scorer", None)  # the head module: [emb] keeps its spec, gated / late ones build it
    spec = getattr(module, "spec", None) or (module.head_spec() if hasattr(module, "head_spec") else None)
    return {"name": scorer.name, "weights_hash": scorer.weights_hash,
            "head": (spec or {}).get("head", "cls"),
            "query_max_length": getattr(lengths, "query_max_length", None),
            "max_length": getattr(lengths, "max_length", None)}


def make_plan(scorer, queries: Sequence[str], documents: Sequence[str], chunk: int, parts: bool = False) -> dict:
    plan = {"format_version": FORMAT_VERSION, "cross_encoder": scorer_identity(scorer),
            "queries_sha256": hash_strings(list(queries)), "documents_sha256": hash_strings(list(documents)),
            "shape": [len(queries), len(documents)], "chunk_queries": chunk}
    if parts:
        plan["parts"] = list(scorer.part_names)
    return plan


def check_plan(work_dir: Path, plan: dict) -> None:
    """Write the plan on first use; afterwards it must be the same plan (same model, texts, lengths, chunking)."""
    path = work_dir / "plan.json"
    if not path.is_file():
        write_json(path, plan)
        return
    found = json.loads(path.read_text(encoding="utf-8"))
    differing = sorted(k for k in set(plan) | set(found) if found.get(k) != plan.get(k))
    if differing:
        raise ValueError(f"{work_dir} holds scores of other inputs (differing: {', '.join(differing)}); "
                         "remove it or choose another work directory")


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def save_chunk(path: Path, scores: np.ndarray) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.npy")
    with open(tmp, "wb") as f:
        np.save(f, scores)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_chunk(path: Path, shape: tuple[int, ...]) -> np.ndarray | None:
    try:
        scores = np.load(path)
    except (OSError, ValueError):
        return None  # missing or torn: scored again
    return scores if scores.shape == shape and scores.dtype == np.float32 else None


def score_matrix(scorer, queries: Sequence[str], documents: Sequence[str], work_dir: str | Path, *,
                 chunk: int = 4, progress: bool = True, parts: bool = False) -> tuple[np.ndarray, dict]:
    """(Q, N) float32 exact scores ((Q, N, P) with `parts`) and {"pairs", "seconds"} spent on them over all
    invocations."""
    if not queries or not documents:
        raise ValueError(f"need at least one query and one document, got {len(queries)} and {len(documents)}")
    if parts and not getattr(scorer, "part_names", ()):
        raise ValueError(f"{scorer.name}: parts=True needs a cross-encoder whose head is a sum of parts")
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    check_plan(work_dir, make_plan(scorer, queries, documents, chunk, parts))
    score = scorer.score_parts if parts else scorer.score
    width = (len(scorer.part_names),) if parts else ()
    timing_path = work_dir / "timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.is_file() else {"pairs": 0, "seconds": 0.0}
    n = len(documents)
    blocks = []
    with tqdm(total=len(queries) * n, unit="pair", disable=not progress, desc="cross-encoder scores") as bar:
        for c, start in enumerate(range(0, len(queries), chunk)):
            part = list(queries[start:start + chunk])
            path = work_dir / f"chunk_{c:05d}.npy"
            scores = load_chunk(path, (len(part), n, *width))
            if scores is None:
                began = time.perf_counter()
                scores = np.stack([np.asarray(score(q, documents), dtype=np.float32) for q in part])
                save_chunk(path, scores)
                timing = {"pairs": timing["pairs"] + len(part) * n,
                          "seconds": timing["seconds"] + time.perf_counter() - began}
                write_json(timing_path, timing)
            blocks.append(scores)
            bar.update(len(part) * n)
    return np.concatenate(blocks), timing
