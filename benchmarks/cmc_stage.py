"""The CMC stage alone, in process: what `prepare` + `compute` cost per query for the shipped CMC (cmc-fusion) over
K candidates, from the hybrid first stage (K = 512, the default /search) or from the bi-encoder alone (K up to the
index's size: the issue's CMC over 16,384 on a smaller index). Run the same script against two checkouts to compare
them (PYTHONPATH=TREE), interleaved by the caller; prints one JSON line.

    PYTHONPATH=. python benchmarks/cmc_stage.py --index /work/idx/scifact --first hybrid --k 512
    PYTHONPATH=. python benchmarks/cmc_stage.py --index /work/idx/scifact --first be --k 5183
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import sieve
import sieve.stages  # noqa: F401  (registers the stages, whose names score columns must carry)
from sieve.index import SearchIndex
from sieve.models.cmc_checkpoint import load_cmc
from sieve.models.text_encoder import TextEncoder
from sieve.models.weights import default_model_path
from sieve.pipeline.first_stage import HybridRetrieve
from sieve.pipeline.stages import CMCRerank, Retrieve
from sieve.pipeline.state import QueryState

QUERIES = ["how do volcanoes erupt", "vitamin d deficiency and bone fractures", "statins and heart disease",
           "gene expression in cancer cells", "antibiotic resistance in bacteria", "sleep and memory"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--first", choices=["hybrid", "be"], default="hybrid")
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    biencoder = TextEncoder.from_pretrained(default_model_path(), name="all-MiniLM-L6-v2")
    bundle = load_cmc(Path(sieve.__file__).parent / "checkpoints" / "cmc-fusion", biencoder)
    with SearchIndex.load(args.index) as index:
        first = HybridRetrieve(index, args.k) if args.first == "hybrid" else Retrieve(index, min(args.k, index.size))
        stage = CMCRerank(bundle, index, batch_candidates=max(16384, args.k))
        states = []
        for query in QUERIES:
            vector = biencoder.encode_queries([query])[0]
            states.append(first(QueryState(query, query_vectors={"be": vector, "cmc": vector})))
        times = []
        for _ in range(args.reps):
            for state in states:
                start = time.perf_counter()
                stage.compute([stage.prepare(state)])
                times.append(time.perf_counter() - start)
    print(json.dumps({"tree": str(Path(sieve.__file__).parent.parent), "first": args.first, "k": args.k,
                      "median_ms": round(statistics.median(times) * 1e3, 3), "n": len(times)}))


if __name__ == "__main__":
    main()
