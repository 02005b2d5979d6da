"""Loopback load on /search: QPS and latency percentiles at 1, 4, 16, 64 concurrent clients, micro-batching on
against off, through a real `sieve serve` process each time.

Every client sends its next request as soon as the previous one is answered (closed loop), on its own keep-alive
connection (gpu.py RawClient; httpx until the thirty-sixth session), for a fixed time per cell after a short warm-up. The result cache is off (SIEVE_CACHE_ENABLED=false) so every request does the model
work; queries are SciFact's test queries (or the demo queries), each client starting at its own offset.

    python benchmarks/load.py                       # SciFact index, 20 s per cell (~6 min with a warm cache)
    python benchmarks/load.py --quick --out /tmp/load.json   # demo index, 4 s per cell, 1/4/16 clients

`--baseline-ref REF` also serves Sieve at git commit REF (exported with `git archive`, its own index built by its own
code) and runs every cell on both servers, blocks interleaved (ABBA, `--rounds` per side): the before/after of a
change, as QPS ratios measured in one run (`speedup_vs_baseline`).

    python benchmarks/load.py --clients 16 --batching on --rounds 2 --baseline-ref 7a6b3d0   # #17's /search target
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # overhead.py's process-tree CPU, gpu.py's raw client

SEED = 0
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
CACHE_DIR = Path(os.environ.get("SIEVE_TEST_CACHE", Path.home() / ".cache" / "sieve-tests"))
DEMO_QUERIES = ["how do volcanoes erupt", "baking bread with yeast", "jazz improvisation", "telescopes and galaxies",
                "roman legions and roads", "database transactions", "protein folding", "bicycle gears",
                "green tea processing", "river deltas and sediment"]
TARGET = "with batching, QPS at 16 clients >= 1.5x the QPS without it, zero errors"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the server: the process and every process below it (its worker processes; until
    the thirty-seventh session this read the first process alone, and printed 0.0 since `sieve serve` became a
    supervisor), all threads, from /proc."""
    from overhead import tree_cpu_s

    return tree_cpu_s(pid)


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
        ok = (await client.send({**body, "query": queries[i % len(queries)]})).startswith("200")
        if time.monotonic() <= until:  # a request that ends after the bell is not counted
            out["latencies" if ok else "errors"].append((time.perf_counter() - started) * 1000)
        i += 1


async def run_cell(url: str, pid: int, queries: list[str], clients: int, body: dict, warmup_s: float,
                   duration_s: float) -> dict:
    """Each client on its own keep-alive connection, written and read as bytes (gpu.py RawClient, with
    Cache-Control: no-cache): httpx's shared client cost 2.4-9.2 ms of CPU per request on these hosts, enough to be
    the limit itself (RESULTS.md, issue 32, thirty-sixth session)."""
    from gpu import RawClient

    connections = [RawClient(f"{url}/search") for _ in range(clients)]
    try:
        warm = {"latencies": [], "errors": []}
        await asyncio.gather(*(client_loop(conn, queries, c * 7, body, time.monotonic() + warmup_s, warm)
                               for c, conn in enumerate(connections)))
        out = {"latencies": [], "errors": []}
        load_start = os.getloadavg()[0]
        cpu_start = cpu_seconds(pid)
        started = time.monotonic()
        await asyncio.gather(*(client_loop(conn, queries, c * 7 + 1000, body, started + duration_s, out)
                               for c, conn in enumerate(connections)))
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(pid) - cpu_start
    finally:
        for conn in connections:
            conn.close()
    lat = out["latencies"]
    return {"clients": clients, "qps": round(len(lat) / elapsed, 2), "p50_ms": round(percentile(lat, 50), 1),
            "p95_ms": round(percentile(lat, 95), 1), "p99_ms": round(percentile(lat, 99), 1),
            "errors": len(out["errors"]), "requests": len(lat), "duration_s": round(elapsed, 1),
            "load_avg_1m_start": round(load_start, 2), "load_avg_1m_end": round(os.getloadavg()[0], 2),
            # CPU the server spent per answered request: what batching saves, whatever else the machine runs
            "server_cpu_ms_per_request": round(cpu * 1000 / max(len(lat), 1), 1),
            "server_cpu_cores_used": round(cpu / elapsed, 2)}


def export_ref(ref: str, out: Path) -> Path:
    """Sieve's tree at commit `ref`, unpacked (no checkout)."""
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def build_index_at(root: Path, out_dir: Path, corpus: str) -> None:
    """The index built by the code at `root` (an older commit may read only its own index format)."""
    code = "import sys; from pathlib import Path; from benchmarks.load import build_index; " \
           "build_index(Path(sys.argv[1]), sys.argv[2])"
    subprocess.run([sys.executable, "-c", code, str(out_dir), corpus], cwd=root, check=True,
                   env={**os.environ, "PYTHONPATH": str(root)})


def run_mode(sides: dict[str, tuple[Path, Path]], queries: list[str], batching: bool, args, log_dir: Path) -> list[dict]:
    """Every cell on every side ({name: (code root, index dir)}), sides alternating ABBA for `args.rounds` rounds."""
    from tests.server import Server

    servers = {}
    body = {"top_k": 10, "retrieve_k": args.retrieve_k, "rerank": args.rerank, "retriever": args.retriever}
    rows = []
    try:
        for name, (root, index_dir) in sides.items():
            env = {"SIEVE_INDEX_DIR": str(index_dir), "SIEVE_BATCHING": str(batching).lower(),
                   "SIEVE_CACHE_ENABLED": "false", "SIEVE_MAX_INFLIGHT": str(max(args.clients) * 2),
                   "SIEVE_LOG_LEVEL": "warning", "PYTHONPATH": str(root), "SIEVE_CMC_PATH": args.cmc_path}
            servers[name] = Server(env, log_dir / f"server-{name}-batching-{batching}.log", cwd=root)
        order = list(servers)
        for clients in args.clients:
            for r in range(args.rounds):
                for name in (order if r % 2 == 0 else order[::-1]):
                    server = servers[name]
                    row = asyncio.run(run_cell(server.url, server.proc.pid, queries, clients, body, args.warmup,
                                               args.duration))
                    rows.append({"side": name, "round": r, "batching": batching, **row})
                    print(f"{name} batching={batching} clients={clients} round {r}: {row['qps']} QPS, p50 "
                          f"{row['p50_ms']} ms, p99 {row['p99_ms']} ms, errors {row['errors']}, server CPU "
                          f"{row['server_cpu_ms_per_request']} ms/request", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| side | clients | batching | QPS | p50 ms | p95 ms | p99 ms | errors | server CPU ms/request | load 1m |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['side']} | {r['clients']} | {'on' if r['batching'] else 'off'} | {r['qps']} | {r['p50_ms']} | "
              f"{r['p95_ms']} | {r['p99_ms']} | {r['errors']} | {r['server_cpu_ms_per_request']} | "
              f"{r['load_avg_1m_start']} |" for r in rows]
    return "\n".join(lines)


def pooled_qps(rows: list[dict]) -> float:
    return sum(r["requests"] for r in rows) / sum(r["duration_s"] for r in rows)


def vs_baseline(rows: list[dict]) -> dict[str, float]:
    """QPS of this commit / the baseline's, pooled over rounds, per batching mode and client count."""
    out = {}
    for batching, clients in sorted({(r["batching"], r["clients"]) for r in rows}):
        cell = [r for r in rows if (r["batching"], r["clients"]) == (batching, clients)]
        new, old = ([r for r in cell if r["side"] == side] for side in ("sieve", "baseline"))
        if new and old:
            out[f"batching={'on' if batching else 'off'} clients={clients}"] = round(pooled_qps(new) / pooled_qps(old), 2)
    return out


def speedups(rows: list[dict], key: str = "qps", invert: bool = False) -> dict[str, float]:
    """Batching on / off per client count for this commit (off / on with invert: for costs, where less is better)."""
    rows = [r for r in rows if r["side"] == "sieve"]
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
    parser.add_argument("--retriever", default="be", help="first stage of the request (be: the bi-encoder + MIPS)")
    parser.add_argument("--cmc-path", default="shipped:cmc",
                        help="SIEVE_CMC_PATH served (shipped:cmc: the paper-style two-layer CMC, 4.4 GFLOP at K=512; "
                             "the default shipped:cmc-fusion has no attention layers)")
    parser.add_argument("--batching", choices=["both", "on", "off"], default="both", help="server micro-batching")
    parser.add_argument("--rounds", type=int, default=1, help="blocks per side per cell (sides alternate ABBA)")
    parser.add_argument("--baseline-ref", help="also serve Sieve at this git commit, interleaved (before/after)")
    parser.add_argument("--shared", action="store_true", help="record that other work ran on the machine meanwhile")
    parser.add_argument("--quick", action="store_true", help="demo index, 1/4/16 clients, 4 s cells")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "load.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.corpus, args.clients, args.duration, args.warmup = "demo", [1, 4, 16], 4.0, 1.0
    args.corpus = args.corpus or ("scifact" if (SCIFACT / "corpus.jsonl").is_file() else "demo")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from benchmarks.cmc_latency import machine

    info = machine()
    with tempfile.TemporaryDirectory(prefix="sieve-load-") as tmp:
        index_dir = Path(tmp) / "index"
        queries = build_index(index_dir, args.corpus)
        sides = {"sieve": (REPO, index_dir)}
        if args.baseline_ref:
            root = export_ref(args.baseline_ref, Path(tmp) / "baseline" / "repo")
            (root.parent / "shared").symlink_to(REPO.parent / "shared")  # its benchmarks find ../shared/data too
            build_index_at(root, Path(tmp) / "baseline-index", args.corpus)
            sides["baseline"] = (root, Path(tmp) / "baseline-index")
        modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.batching]
        rows = [row for batching in modes for row in run_mode(sides, queries, batching, args, Path(tmp))]
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    result = {"machine": info, "target": TARGET, "corpus": args.corpus, "queries": len(queries),
              "shared_machine": args.shared, "baseline_ref": args.baseline_ref, "rounds": args.rounds,
              "speedup_vs_baseline": vs_baseline(rows) if args.baseline_ref else None,
              "request": {"top_k": 10, "retrieve_k": args.retrieve_k, "rerank": args.rerank,
                          "retriever": args.retriever, "headers": {"Cache-Control": "no-cache"}},
              "cmc_path": args.cmc_path,
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
    if args.baseline_ref:
        print(f"QPS of this commit / {args.baseline_ref}'s: {result['speedup_vs_baseline']}")


if __name__ == "__main__":
    main()
