"""Matrix-vector products computed by many request threads at once, as a server's request threads compute them (the
click memory's nearest remembered queries: `ClickMemory.nearest`, up to 50,000 x 384; a flat index segment's
scores; and `ClickMemory.boost` itself on 512 candidates), with numpy's BLAS at its default threads and on one thread (what a serving process sets:
service/components.py `single_threaded_blas`). Interleaved rounds; CPU and wall milliseconds per product.

    .venv/bin/python benchmarks/blas_concurrency.py --out benchmarks/results/blas_concurrency_intel.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_call(call, threads: int, calls: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per call with `threads` threads each making `calls` calls of `call()`."""
    def work():
        for _ in range(calls):
            call()
    pool = [threading.Thread(target=work) for _ in range(threads)]
    cpu, wall = time.process_time(), time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    n = threads * calls
    return 1000 * (time.process_time() - cpu) / n, 1000 * (time.perf_counter() - wall) / n


def memory_of(queries: int, dim: int, rng) -> tuple:
    """A click memory of `queries` remembered queries (5 clicked documents each, nearest-queries term on, near_k 8)
    and the ids of 512 candidates, some of them remembered."""
    from sieve.feedback.memory import ClickMemory

    keys = [f"q{i}" for i in range(queries)]
    vectors = rng.standard_normal((queries, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    pairs = {k: {f"d{(7 * i + j) % 5000}": 1.0 for j in range(5)} for i, k in enumerate(keys)}
    memory = ClickMemory(1.0, 0.5, 10.0, 0.1, pairs, {f"d{i}": 0.5 for i in range(0, 5000, 3)}, w_near=1.0,
                         near_min=-1.0, near_k=8, near_keys=keys, near_vectors=vectors)
    return memory, [f"d{i}" for i in range(512)]


def main() -> None:
    from benchmarks.cmc_latency import machine

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="512,1000,2000,5183,20000,50000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--memory-queries", default="1000,5000,20000", help="remembered queries of a click memory")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--products", type=int, default=20, help="per thread per block")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    vector = rng.standard_normal(args.dim).astype(np.float32)
    default = {i["filepath"].rsplit("/", 1)[-1]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    rows = []
    for n in (int(x) for x in args.rows.split(",")):
        matrix = rng.standard_normal((n, args.dim)).astype(np.float32)
        for r in range(args.rounds):
            for side in ("default", "one thread"):
                if side == "default":
                    cpu, wall = per_call(lambda: matrix @ vector, args.threads, args.products)
                else:
                    with threadpool_limits(limits=1, user_api="blas"):
                        cpu, wall = per_call(lambda: matrix @ vector, args.threads, args.products)
                rows.append({"rows": n, "round": r, "blas": side, "cpu_ms": round(cpu, 4), "wall_ms": round(wall, 4),
                             "load_avg_1m": round(os.getloadavg()[0], 2)})
                print(json.dumps(rows[-1]), flush=True)
    for queries in (int(x) for x in args.memory_queries.split(",")):
        memory, ids = memory_of(queries, args.dim, rng)
        for r in range(args.rounds):
            for side in ("default", "one thread"):
                if side == "default":
                    cpu, wall = per_call(lambda: memory.boost("unknown", ids, vector), args.threads, args.products)
                else:
                    with threadpool_limits(limits=1, user_api="blas"):
                        cpu, wall = per_call(lambda: memory.boost("unknown", ids, vector), args.threads, args.products)
                rows.append({"memory_queries": queries, "round": r, "blas": side, "cpu_ms": round(cpu, 4),
                             "wall_ms": round(wall, 4), "load_avg_1m": round(os.getloadavg()[0], 2)})
                print(json.dumps(rows[-1]), flush=True)
    print(f"\n| rows x {args.dim} | BLAS default: CPU ms per product | one thread | ratio |\n|---:|---:|---:|---:|")
    for key, label in (("rows", "{:,}"), ("memory_queries", "ClickMemory.boost, {:,} remembered queries")):
        for n in sorted({row[key] for row in rows if key in row}):
            med = {side: float(np.median([x["cpu_ms"] for x in rows if x.get(key) == n and x["blas"] == side]))
                   for side in ("default", "one thread")}
            print(f"| {label.format(n)} | {med['default']:.3f} | {med['one thread']:.3f} | "
                  f"{med['default'] / med['one thread']:.1f}x |")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "threads": args.threads, "dim": args.dim,
                                        "blas_default_threads": default, "rows": rows,
                                        "command": " ".join(["python", *sys.argv])}, indent=2) + "\n")


if __name__ == "__main__":
    main()
