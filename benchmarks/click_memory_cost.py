"""What the click memory adds to a /search request: `remembered` (sieve/pipeline/searcher.py) on the candidates a
default /search reranks (retrieve_k 512), timed alone, for a query the memory knows and one it does not; with the
query vector /search passes (a remembered query's own for the known one, a random one for the other), so the
nearest-queries term is timed too.

    .venv/bin/python benchmarks/click_memory_cost.py --memory <INDEX>/clicks/m000001 --out benchmarks/results/click_memory_cost.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import sieve.stages  # noqa: E402,F401 (registers the stages whose score columns the candidates hold)

from sieve.feedback.memory import ClickMemory  # noqa: E402
from sieve.pipeline.candidates import Candidates  # noqa: E402
from sieve.pipeline.searcher import remembered  # noqa: E402


class Ids:
    def __init__(self, ids):
        self.table = np.asarray(ids, dtype=object)

    def ids(self, rows):
        return self.table[rows].tolist()


def near_vector(memory: ClickMemory, rng, known: bool):
    """The query vector /search hands the memory (its nearest-queries term searches the remembered ones with it):
    a remembered query's own (its neighbours are then as near as they come), or a random direction; None when the
    memory has no such term."""
    if not memory.w_near or memory.near_vectors is None:
        return None
    if known:
        return memory.near_vectors[0].copy()
    v = rng.normal(size=memory.near_vectors.shape[1]).astype(np.float32)
    return v / np.linalg.norm(v)


def main() -> None:
    from sieve.evaluation.report import machine_info

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memory", type=Path, required=True, help="a published memory directory")
    ap.add_argument("--candidates", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    memory = ClickMemory.load(args.memory)
    known = set(memory.docs) | {d for pair in memory.pairs.values() for d in pair}
    ids = sorted(known) + [f"unknown-{i}" for i in range(max(0, args.candidates - len(known)))]
    rng = np.random.default_rng(0)
    key = next(iter(memory.pairs), None)
    query_known = next((q for q in [key] if q is not None), None)
    out = {"memory": str(args.memory), "entries": len(memory), "queries": len(memory.pairs),
           "near": {"w_near": memory.w_near, "near_k": memory.near_k, "near_min": memory.near_min,
                    "remembered_vectors": 0 if memory.near_vectors is None else len(memory.near_vectors)},
           "documents": len(memory.docs), "candidates": args.candidates, "machine": machine_info(),
           "load_before": os.getloadavg(), "us_per_request": {}}
    for label in ("query in the memory", "query not in the memory"):
        # a known query's hash can be looked up only through its text; time the same path with a stand-in text
        # whose hash we register under the known key's entries
        text = f"stand-in query {label}"
        if label == "query in the memory" and query_known is not None:
            memory.pairs[ClickMemory.key_of(text)] = memory.pairs[query_known]
        rows = rng.choice(len(ids), args.candidates, replace=False)
        cands = Candidates(rows, {"retrieve": np.sort(rng.normal(size=args.candidates))[::-1].astype(np.float32),
                                  "cmc": np.sort(rng.normal(size=args.candidates))[::-1].astype(np.float32)})
        index = Ids(ids)
        vector = near_vector(memory, rng, label == "query in the memory")
        remembered(memory, text, cands, index, vector)
        blocks = []
        for _ in range(7):  # the median block: the host is shared
            began = time.perf_counter()
            for _ in range(args.repeat // 7):
                remembered(memory, text, cands, index, vector)
            blocks.append((time.perf_counter() - began) / (args.repeat // 7) * 1e6)
        out["us_per_request"][label] = round(float(np.median(blocks)), 1)
    out["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["us_per_request"]), out["load_before"])


if __name__ == "__main__":
    main()
