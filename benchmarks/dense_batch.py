"""CPU per query of the first stage's exact vector search, alone and in batches (pipeline/dense_batch.py): FAISS
over a served index's flat vectors with its own choice of kernel, and as a serving runner searches a batch
(`search_batch`: the matrix-product kernel from BLAS_MIN_BATCH queries), and torch's matrix product + top-k over the
same memory-mapped vectors (index/device_flat.py on the CPU: what an Intel CPU server searches with by default since
the eleventh session, SIEVE_FLAT_SEARCH_ON_DEVICE); and torch's product over a bfloat16 copy (half the bytes read
per query; served on CPUs with native bf16 products since the forty-third session, SIEVE_FLAT_SEARCH_PRECISION).
Interleaved rounds on one thread, FAISS, BLAS and torch on one thread (as a pinned worker's runner runs them); medians
of CPU microseconds per query. Then what the bf16 copy changes: for queries near documents (a document's own vector
plus noise, renormalised) and random unit vectors, the share of FAISS's exact top 10 and top k it returns, and its
largest score error.

    .venv/bin/python benchmarks/dense_batch.py --index ../idx/scifact --out benchmarks/results/dense_batch_intel.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_query_us(search, vectors: np.ndarray, batch: int, seconds: float) -> float:
    """CPU microseconds per query of `search(queries)` over batches of `batch` queries, for about `seconds`."""
    calls, at, cpu = 0, 0, time.process_time()
    while time.process_time() - cpu < seconds:
        search(vectors[at:at + batch])
        at, calls = (at + batch) % (len(vectors) - batch), calls + 1
    return 1e6 * (time.process_time() - cpu) / (calls * batch)


def main() -> None:
    import torch
    from threadpoolctl import threadpool_limits

    from benchmarks.cmc_latency import machine
    from sieve.index import SearchIndex
    from sieve.pipeline.dense_batch import BLAS_MIN_BATCH, blas_kernel, faiss_one_thread, search_batch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="a `sieve index build` directory (flat vectors)")
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.5, help="per cell and round")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rng = np.random.default_rng(0)
    faiss_one_thread()
    threadpool_limits(1)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    with SearchIndex.load(args.index) as index, SearchIndex.load(args.index, flat_device="cpu") as on_torch, \
            SearchIndex.load(args.index, flat_device="cpu", flat_cpu_dtype="bf16") as on_bf16:
        vectors = rng.standard_normal((512, index.manifest.dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)

        def faiss_default(queries):
            blas_kernel(False)
            return index.search(queries, args.k)

        def served(queries):
            return list(search_batch([(index, q, args.k) for q in queries]))

        def served_torch(queries):
            return list(search_batch([(on_torch, q, args.k) for q in queries]))

        def torch_bf16(queries):
            return list(search_batch([(on_bf16, q, args.k) for q in queries]))

        kernels = {"FAISS's own choice": faiss_default, f"FAISS as served (matrix product from {BLAS_MIN_BATCH})": served,
                   "torch over the memory map from 2 queries": served_torch,
                   "torch over a bfloat16 copy (served with native bf16)": torch_bf16}
        cells: dict = {(name, b): [] for name in kernels for b in batches}
        for r in range(args.rounds):
            for name, search in (kernels.items() if r % 2 == 0 else reversed(kernels.items())):
                for b in batches:
                    cells[(name, b)].append(per_query_us(search, vectors, b, args.seconds))
        rows = [{"kernel": name, "batch": b, "cpu_us_per_query": round(statistics.median(v), 1),
                 "rounds": [round(x, 1) for x in v]} for (name, b), v in cells.items()]
        median = {(r["kernel"], r["batch"]): r["cpu_us_per_query"] for r in rows}
        print(f"{index.size} rows x {index.manifest.dim}, top {args.k}, CPU us per query (median of {args.rounds})")
        print("| batch | " + " | ".join(kernels) + " | torch / FAISS as served | bf16 / torch |\n|---:|"
              + "---:|" * (len(kernels) + 2))
        names = list(kernels)
        for b in batches:
            ratio = median[(names[2], b)] / median[(names[1], b)]
            bf16 = median[(names[3], b)] / median[(names[2], b)]
            print(f"| {b} | " + " | ".join(f"{median[(n, b)]:.0f}" for n in kernels) + f" | {ratio:.2f} | {bf16:.2f} |")
        fidelity = bf16_fidelity(index, on_bf16, vectors, args.k, rng)
        for kind, f in fidelity.items():
            print(f"bf16 copy, {kind}: top 10 {f['top10_same']:.4f}, top {args.k} {f['topk_same']:.4f} of FAISS's exact "
                  f"lists; top 10 identical for {f['top10_identical']:.3f} of queries; max score error "
                  f"{f['max_score_error']:.5f}")
        args.out.write_text(json.dumps({"machine": machine(), "index": str(args.index), "rows": index.size,
                                        "dim": index.manifest.dim, "k": args.k, "command": " ".join(sys.argv),
                                        "load_before": load_before, "load_after": os.getloadavg(),
                                        "cells": rows, "bf16_fidelity": fidelity}, indent=1) + "\n")


def bf16_fidelity(index, on_bf16, random_vectors: np.ndarray, k: int, rng) -> dict:
    """What the bf16 copy's search returns against FAISS's exact float32 search, per kind of query."""
    near = np.asarray(index.embeddings(rng.choice(index.size, 512, replace=False)), dtype=np.float32)
    near = near + 0.05 * rng.standard_normal(near.shape).astype(np.float32)
    near /= np.linalg.norm(near, axis=1, keepdims=True)
    out = {}
    for kind, queries in (("near documents", near), ("random", random_vectors)):
        want_s, want_r = index.search(queries, k)
        got_s, got_r = on_bf16.search(queries, k)
        out[kind] = {"queries": len(queries),
                     "top10_same": float(np.mean([len(set(a[:10]) & set(b[:10])) / 10 for a, b in zip(got_r, want_r)])),
                     "topk_same": float(np.mean([len(set(a) & set(b)) / k for a, b in zip(got_r, want_r)])),
                     "top10_identical": float(np.mean([(a[:10] == b[:10]).all() for a, b in zip(got_r, want_r)])),
                     "max_score_error": float(np.abs(got_s - want_s).max())}
    return out


if __name__ == "__main__":
    main()
