"""Is the default /search within 3x the bi-encoder's latency? One client, one `sieve serve` with the shipped
defaults over a SciFact index, requests in interleaved blocks (be-only, default, other pipelines, be-only, ...)
so machine noise hits every pipeline alike; every request sends Cache-Control: no-cache. Reports p50 / p95 per
pipeline and each p50 as a ratio to the bi-encoder's. Usage:
  python benchmarks/default_latency.py --index ~/.cache/sieve/eval-indexes/scifact-<key> \
      --queries ../shared/data/scifact/queries.jsonl --out benchmarks/results/default_latency.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cmc_latency import machine  # noqa: E402
from sieve.index import read_queries  # noqa: E402

PIPELINES = {  # name -> /search body (besides query); {} = the server's defaults
    "be": {"retriever": "be", "rerank": "none", "cross_encoder": False},
    "default": {},
    "hybrid": {"retriever": "hybrid", "rerank": "none", "cross_encoder": False},
    "bm25": {"retriever": "bm25", "rerank": "none", "cross_encoder": False},
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="a SciFact index with a BM25 part")
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--per-block", type=int, default=25, help="queries per pipeline per block")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from tests.server import Server

    texts = list(read_queries(args.queries).values())
    times: dict[str, list[float]] = {name: [] for name in PIPELINES}
    with tempfile.TemporaryDirectory() as logs:
        server = Server({"SIEVE_INDEX_DIR": str(args.index)}, Path(logs) / "server.log", shipped_models=True)
        try:
            with server.client() as client:
                ready = client.get("/readyz").json()
                headers = {"Cache-Control": "no-cache"}
                for text in texts[:10]:  # warm-up: thread pools, allocator
                    for body in PIPELINES.values():
                        client.post("/search", json={"query": text, **body}, headers=headers)
                for block in range(args.blocks):
                    chunk = texts[(block * args.per_block) % len(texts):][:args.per_block]
                    for name, body in PIPELINES.items():
                        for text in chunk:
                            started = time.perf_counter()
                            response = client.post("/search", json={"query": text, "top_k": 10, **body},
                                                   headers=headers)
                            elapsed = (time.perf_counter() - started) * 1000
                            assert response.status_code == 200, response.text
                            times[name].append(elapsed)
                stages = client.post("/search", json={"query": texts[0]}, headers=headers).json()["stages"]
        finally:
            server.stop()
    be_p50 = statistics.median(times["be"])
    rows = [{"pipeline": name, "body": PIPELINES[name], "requests": len(v), "p50_ms": round(statistics.median(v), 2),
             "p95_ms": round(percentile(v, 95), 2), "p50_ratio_to_be": round(statistics.median(v) / be_p50, 2)}
            for name, v in times.items()]
    print("| pipeline | requests | p50 ms | p95 ms | p50 / be p50 |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['pipeline']} | {r['requests']} | {r['p50_ms']} | {r['p95_ms']} | {r['p50_ratio_to_be']} |")
    if args.out:
        doc = {"machine": machine(), "index": str(args.index), "index_size": ready["index_size"],
               "models": ready["models"], "default_stages": stages, "clients": 1,
               "command": shlex.join(["python", *sys.argv]), "rows": rows}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
