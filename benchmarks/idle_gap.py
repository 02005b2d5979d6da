"""What the same work costs in CPU when the core it runs on goes idle between calls: why a /search costs more server
CPU at fewer clients per worker, and so why two workers on two cores, each with half the clients, spend more CPU per
request than one worker with all of them (issue 32: 2 workers >= 1.6x one worker; benchmarks/overhead.py).

One thread calls a fixed piece of work again and again, sleeping `gap` milliseconds before each call, and reads its
own CPU time (time.thread_time) around the call only, so the sleep is never counted. Two kinds of work, each what a
/search spends its CPU on outside the model forwards:

- `dense`: the flat vector search's work, a (4, 384) x (384, 5,183) product and the top 512 of each row (numpy's
  argpartition): SciFact's shape, random vectors; the product is numpy's with its BLAS on one thread (the server's
  own is torch's, index/device_flat.py);
- `python`: interpreter work, a response-shaped dict of 100 hits built and serialised with json.

The gaps run in interleaved rounds (order reversed every other round); the table gives each gap's median CPU per call
and its ratio to no gap. A ratio above 1 is the cost of waking on a cold core (caches refilled, a slower clock, on a
virtual machine the host's own scheduling); the product cannot change it, only keep its cores busy.

    python benchmarks/idle_gap.py --rounds 5 --out benchmarks/results/idle_gap_zen3_s41.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sieve.evaluation.report import machine_info  # noqa: E402

GAPS_MS = (0.0, 0.2, 1.0, 3.0)


def dense_work(rng: np.random.Generator):
    vectors = rng.standard_normal((5183, 384)).astype(np.float32)
    queries = rng.standard_normal((4, 384)).astype(np.float32)

    def work() -> None:
        scores = queries @ vectors.T
        np.argpartition(-scores, 511, axis=1)
    return work


def python_work(rng: np.random.Generator):
    ids = [f"doc-{i}" for i in rng.integers(0, 10**6, 100)]
    scores = rng.standard_normal(100).tolist()

    def work() -> None:
        hits = [{"id": doc, "score": round(score, 6), "rank": rank + 1, "scores": {"cmc": score, "be": score / 2}}
                for rank, (doc, score) in enumerate(zip(ids, scores))]
        json.dumps({"results": hits, "timings_ms": {"total": 1.0}})
    return work


def cpu_per_call_ms(work, gap_ms: float, calls: int) -> float:
    gap_s, spent = gap_ms / 1000, 0.0
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        started = time.thread_time()
        work()
        spent += time.thread_time() - started
    return spent / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=400, help="calls per gap per round")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    threadpool_limits(limits=1, user_api="blas")
    rng = np.random.default_rng(0)
    works = {"dense": dense_work(rng), "python": python_work(rng)}
    for work in works.values():  # warm: pages touched, caches and the allocator settled
        cpu_per_call_ms(work, 0.0, 200)
    rows = []
    for r in range(args.rounds):
        for gap in (GAPS_MS if r % 2 == 0 else GAPS_MS[::-1]):
            for name, work in works.items():
                ms = cpu_per_call_ms(work, gap, args.calls)
                rows.append({"round": r, "work": name, "gap_ms": gap, "cpu_ms_per_call": round(ms, 4)})
                print(f"round {r} {name:6s} gap {gap:3.1f} ms: {ms:.4f} ms CPU per call", flush=True)
    summary = {}
    for name in works:
        base = statistics.median(x["cpu_ms_per_call"] for x in rows if x["work"] == name and x["gap_ms"] == 0)
        summary[name] = {str(gap): {"median_ms": round(m, 4), "ratio_to_no_gap": round(m / base, 3)}
                         for gap in GAPS_MS
                         for m in [statistics.median(x["cpu_ms_per_call"] for x in rows
                                                     if x["work"] == name and x["gap_ms"] == gap)]}
    print("\n| work | gap ms | CPU ms per call (median) | ratio to no gap |\n|---|---:|---:|---:|")
    for name, cells in summary.items():
        for gap, cell in cells.items():
            print(f"| {name} | {gap} | {cell['median_ms']} | {cell['ratio_to_no_gap']} |")
    if args.out:
        doc = {"machine": machine_info(), "rounds": args.rounds, "calls": args.calls, "gaps_ms": list(GAPS_MS),
               "summary": summary, "rows": rows, "command": "python " + " ".join(map(shlex.quote, sys.argv)),
               "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
