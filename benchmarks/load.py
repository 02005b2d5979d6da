"""Loopback load on /search: QPS and latency percentiles at 1, 4, 16, 64 concurrent clients, micro-batching on
against off, through a real `sieve serve` process each time.

Every client sends its next request as soon as the previous one is answered (closed loop), for a fixed time per
cell after a short warm-up. The result cache is off (SIEVE_CACHE_ENABLED=false) so every request does the model
work; queries are SciFact's test queries (or the demo queries), each client starting at its own offset.

    python benchmarks/load.py                       # SciFact index, 20 s per cell (~6 min with a warm cache)
    python benchmarks/load.py --quick --out /tmp/load.json   # demo index, 4 s per cell, 1/4/16 clients
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SEED = 0
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
CACHE_DIR = Path(os.environ.get("SIEVE_TEST_CACHE", Path.home() / ".cache" / "sieve-tests"))
DEMO_QUERIES = ["how do volcanoes erupt", "baking bread with yeast", "jazz improvisation", "telescopes and galaxies",
                "roman legions and roads", "database transactions", "protein folding", "bicycle gears",
                "green tea processing", "river deltas and sediment"]
TARGET = "with batching, QPS at 16 clients >= 1.5x the QPS without it, zero errors"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def build_index(out_dir: Path, corpus: str) -> list[str]:
    """The index and the query list: SciFact (test queries) when the data is there, else the bundled demo."""
    import torch

    from sieve.index import build_index as build, read_beir_corpus, read_qrels, read_queries
    from sieve.models.text_encoder import EncoderLengths, TextEncoder
    from sieve.models.weights import default_model_path
    from sieve.cli import DEMO_CORPUS

    torch.manual_seed(SEED)
    encoder = TextEncoder.from_pretrained(default_model_path(), name="all-MiniLM-L6-v2", lengths=EncoderLengths(64, 256))
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    if corpus == "scifact":
        build(read_beir_corpus(SCIFACT / "corpus.jsonl"), encoder, out_dir, cache_dir=CACHE_DIR)
        qrels = read_qrels(SCIFACT / "qrels" / "test.tsv")
        return [text for qid, text in read_queries(SCIFACT / "queries.jsonl").items() if qid in qrels]
    build(read_beir_corpus(DEMO_CORPUS), encoder, out_dir, cache_dir=CACHE_DIR, progress=False)
    return DEMO_QUERIES


async def client_loop(client, queries: list[str], offset: int, body: dict, until: float, out: dict) -> None:
    i = offset
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            response = await client.post("/search", json={**body, "query": queries[i % len(queries)]})
            ok = response.status_code == 200
        except Exception:  # noqa: BLE001 - counted as an error, the run goes on
            ok = False
        if time.monotonic() <= until:  # a request that ends after the bell is not counted
            out["latencies" if ok else "errors"].append((time.perf_counter() - started) * 1000)
        i += 1


async def run_cell(url: str, pid: int, queries: list[str], clients: int, body: dict, warmup_s: float,
                   duration_s: float) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        warm = {"latencies": [], "errors": []}
        await asyncio.gather(*(client_loop(client, queries, c * 7, body, time.monotonic() + warmup_s, warm)
                               for c in range(clients)))
        out = {"latencies": [], "errors": []}
        load_start = os.getloadavg()[0]
        cpu_start = cpu_seconds(pid)
        started = time.monotonic()
        await asyncio.gather(*(client_loop(client, queries, c * 7 + 1000, body, started + duration_s, out)
                               for c in range(clients)))
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(pid) - cpu_start
    lat = out["latencies"]
    return {"clients": clients, "qps": round(len(lat) / elapsed, 2), "p50_ms": round(percentile(lat, 50), 1),
            "p95_ms": round(percentile(lat, 95), 1), "p99_ms": round(percentile(lat, 99), 1),
            "errors": len(out["errors"]), "requests": len(lat), "duration_s": round(elapsed, 1),
            "load_avg_1m_start": round(load_start, 2), "load_avg_1m_end": round(os.getloadavg()[0], 2),
            # CPU the server spent per answered request: what batching saves, whatever else the machine runs
            "server_cpu_ms_per_request": round(cpu * 1000 / max(len(lat), 1), 1),
            "server_cpu_cores_used": round(cpu / elapsed, 2)}


def run_mode(index_dir: Path, queries: list[str], batching: bool, args, log_dir: Path) -> list[dict]:
    from tests.server import Server

    env = {"SIEVE_INDEX_DIR": str(index_dir), "SIEVE_BATCHING": str(batching).lower(), "SIEVE_CACHE_ENABLED": "false",
           "SIEVE_MAX_INFLIGHT": str(max(args.clients) * 2), "SIEVE_LOG_LEVEL": "warning"}
    server = Server(env, log_dir / f"server-batching-{batching}.log")
    body = {"top_k": 10, "retrieve_k": args.retrieve_k, "rerank": args.rerank}
    rows = []
    try:
        for clients in args.clients:
            row = asyncio.run(run_cell(server.url, server.proc.pid, queries, clients, body, args.warmup, args.duration))
            rows.append({"batching": batching, **row})
            print(f"batching={batching} clients={clients}: {row['qps']} QPS, p50 {row['p50_ms']} ms, "
                  f"p99 {row['p99_ms']} ms, errors {row['errors']}, server CPU {row['server_cpu_ms_per_request']} "
                  f"ms/request", file=sys.stderr)
    finally:
        server.stop()
    return rows


def machine() -> dict:
    import torch

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    return {"cpu": models[0] if models else platform.processor(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "platform": platform.platform(),
            "load_avg_start": [round(x, 2) for x in os.getloadavg()]}


def table(rows: list[dict]) -> str:
    lines = ["| clients | batching | QPS | p50 ms | p95 ms | p99 ms | errors | server CPU ms/request | load 1m |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['clients']} | {'on' if r['batching'] else 'off'} | {r['qps']} | {r['p50_ms']} | {r['p95_ms']} | "
              f"{r['p99_ms']} | {r['errors']} | {r['server_cpu_ms_per_request']} | {r['load_avg_1m_start']} |"
              for r in rows]
    return "\n".join(lines)


def speedups(rows: list[dict], key: str = "qps", invert: bool = False) -> dict[str, float]:
    """Batching on / off per client count (off / on with invert: for costs, where less is better)."""
    by = {(r["clients"], r["batching"]): r[key] for r in rows}
    ratio = {}
    for c in sorted({r["clients"] for r in rows}):
        on, off = by.get((c, True)), by.get((c, False))
        if on and off:
            ratio[str(c)] = round(off / on if invert else on / off, 2)
    return ratio


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=["scifact", "demo"], help="default: scifact when ../shared has it")
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 64])
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each cell")
    parser.add_argument("--retrieve-k", type=int, default=512, help="candidates CMC reranks per query")
    parser.add_argument("--rerank", choices=["cmc", "none"], default="cmc",
                        help="none: bi-encoder + MIPS only, where per-request overhead weighs most")
    parser.add_argument("--quick", action="store_true", help="demo index, 1/4/16 clients, 4 s cells")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "load.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.corpus, args.clients, args.duration, args.warmup = "demo", [1, 4, 16], 4.0, 1.0
    args.corpus = args.corpus or ("scifact" if (SCIFACT / "corpus.jsonl").is_file() else "demo")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    info = machine()
    with tempfile.TemporaryDirectory(prefix="sieve-load-") as tmp:
        index_dir = Path(tmp) / "index"
        queries = build_index(index_dir, args.corpus)
        rows = [row for batching in (False, True) for row in run_mode(index_dir, queries, batching, args, Path(tmp))]
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    result = {"machine": info, "target": TARGET, "corpus": args.corpus, "queries": len(queries),
              "request": {"top_k": 10, "retrieve_k": args.retrieve_k, "rerank": args.rerank},
              "duration_s": args.duration, "warmup_s": args.warmup, "speedup_qps": speedups(rows),
              "cpu_saving": speedups(rows, "server_cpu_ms_per_request", invert=True), "rows": rows,
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join(["python", "benchmarks/load.py", *(sys.argv[1:] if argv is None else argv)]),
              "quick": args.quick}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    print(f"\nQPS with batching / without, by clients: {result['speedup_qps']}  (target: {TARGET})")
    print(f"server CPU per request without batching / with, by clients: {result['cpu_saving']}")


if __name__ == "__main__":
    main()
