"""Can the load generator keep up? benchmarks/gpu.py's two clients against one zero-cost server (benchmarks/zero_cost.py:
the model forwards replaced by stand-ins, so the server answers as fast as it can), interleaved blocks, the order
reversed every other round:

- `httpx`: closed-loop asyncio clients sharing one httpx.AsyncClient in one process, the client of the issue's own
  GPU figures (../shared/gpu-check/gpu_bench.py) and of the thirty-fifth session's H200 run;
- `raw`: the same clients, each on its own keep-alive connection written and read as bytes (gpu.py RawClient).

Each row records QPS, latency and the client's own CPU per request: a client that needs milliseconds of CPU per
request caps what one process can send, whatever the server does.

    python benchmarks/client_cost.py --index /work/idx/scifact --out benchmarks/results/client_cost_zen4.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu  # noqa: E402
import overhead  # noqa: E402
from sieve.evaluation.report import machine_info  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, default=Path("/work/idx/scifact"))
    parser.add_argument("--queries", type=Path, default=REPO.parent / "shared/data/scifact/queries.jsonl")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", default="16,64")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm-s", type=float, default=2.0)
    parser.add_argument("--measure-s", type=float, default=8.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    queries = [json.loads(line)["text"] for line in args.queries.open()][:300]
    bodies = gpu.Bodies(queries, {})
    server = overhead.Side("zero-cost", REPO, args.workers, zero_cost=True, env={"SIEVE_CACHE_ENABLED": "false"})
    overhead.start(server, args.index, Path("/tmp/client_cost_server.log"))
    url = f"{server.url}/search"
    rows = []
    try:
        for r in range(args.rounds):
            for clients in (int(c) for c in args.clients.split(",")):
                for kind in (("raw", "httpx") if r % 2 == 0 else ("httpx", "raw")):
                    out = gpu.clients_window(url, bodies, range(clients), args.warm_s, args.measure_s,
                                             lambda: None, kind)
                    n, lat = sum(out["codes"].values()), sorted(out["lat"])
                    row = {"round": r, "client": kind, "clients": clients, "qps": round(n / out["seconds"], 1),
                           "p50_ms": round(1000 * lat[len(lat) // 2], 1),
                           "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
                           "client_cpu_ms_per_request": round(1000 * out["cpu_s"] / n, 3),
                           "client_busy": round(out["cpu_s"] / out["seconds"], 2), "codes": out["codes"],
                           "load_avg_1m": os.getloadavg()[0]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        overhead.stop(server)
    summary = overhead.by_round(rows, "client", ("raw", "httpx"), ("qps", "client_cpu_ms_per_request", "p50_ms"),
                                "QPS by round | client CPU ms/request | p50 ms")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "what": "benchmarks/gpu.py's httpx and raw clients against one zero-cost server, interleaved",
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "workers": args.workers,
            "rows": rows, "summary": summary, "machine": machine_info()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
