"""What feedback costs the server (issue 33): /search latency with SIEVE_FEEDBACK_ENABLED on vs off (impressions
are written off the request path), and how many events/s POST /feedback stores (each request fsynced).

Two `sieve serve` processes on copies of one index, one with feedback and one without, measured in interleaved
blocks (A B A B ...) so load drift hits both alike; ratios of medians. Then POST /feedback from a few client
threads, each request a batch of --batch click events against answers the server gave.

    .venv/bin/python benchmarks/feedback_overhead.py --index /tmp/fb/scifact --data ../shared/data/scifact \
        --out benchmarks/results/feedback_overhead.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from benchmarks.feedback_sim import Served  # noqa: E402
from sieve.evaluation.dataset import load_split  # noqa: E402


def block(url: str, queries: list[str]) -> list[float]:
    """Client-side ms per /search, fresh work (no-cache), one at a time."""
    out = []
    with httpx.Client(base_url=url, timeout=60, headers={"Cache-Control": "no-cache"}) as c:
        for q in queries:
            t = time.perf_counter()
            c.post("/search", json={"query": q, "top_k": 10}).raise_for_status()
            out.append((time.perf_counter() - t) * 1000)
    return out


def feedback_rate(url: str, queries: list[str], batch: int, requests: int, threads: int) -> dict:
    with httpx.Client(base_url=url, timeout=60) as c:
        answers = [c.post("/search", json={"query": q, "top_k": 10}).json() for q in queries[:50]]
    bodies = [{"events": [{"request_id": a["request_id"], "doc_id": a["results"][i % len(a["results"])]["id"]}
                          for i in range(batch)]} for a in answers]

    def work(part):
        with httpx.Client(base_url=url, timeout=60) as c:
            for i in range(part, requests, threads):
                c.post("/feedback", json=bodies[i % len(bodies)]).raise_for_status()

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    wall = time.perf_counter() - began
    return {"requests": requests, "events_per_request": batch, "threads": threads, "wall_s": round(wall, 2),
            "events_per_s": round(requests * batch / wall, 1), "requests_per_s": round(requests / wall, 1)}


def main() -> None:
    from sieve.evaluation.report import machine_info

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/feedback-overhead"))
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=100)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    queries = list(load_split(args.data, "test").queries.values())
    shutil.rmtree(args.work, ignore_errors=True)
    servers = {}
    load_before = os.getloadavg()
    try:
        for name, on in (("feedback_off", False), ("feedback_on", True)):
            index = args.work / name
            shutil.copytree(args.index, index, ignore=shutil.ignore_patterns("adapted", "feedback"))
            servers[name] = Served(index, args.work / f"{name}.log", 0.0,
                                   {"SIEVE_FEEDBACK_ENABLED": "true" if on else "false"})
        for s in servers.values():
            block(s.url, queries[:20])  # warm-up
        times = {name: [] for name in servers}
        for b in range(args.blocks):
            part = [queries[(b * args.per_block + i) % len(queries)] for i in range(args.per_block)]
            for name, s in (servers.items() if b % 2 == 0 else reversed(servers.items())):
                times[name].append(statistics.median(block(s.url, part)))
        rate = feedback_rate(servers["feedback_on"].url, queries, args.batch, args.requests, 4)
    finally:
        for s in servers.values():
            s.stop()
    p50 = {name: round(statistics.median(v), 2) for name, v in times.items()}
    doc = {"search_p50_ms_by_block": {k: [round(x, 2) for x in v] for k, v in times.items()}, "search_p50_ms": p50,
           "ratio_on_over_off": round(p50["feedback_on"] / p50["feedback_off"], 3),
           "block_ratios": [round(a / b, 3) for a, b in zip(times["feedback_on"], times["feedback_off"])],
           "feedback": rate, "load_before": load_before, "load_after": os.getloadavg(),
           "machine": machine_info(), "command": " ".join(sys.argv)}
    print(json.dumps(doc, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
