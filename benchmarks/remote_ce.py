"""Remote cross-encoder (SIEVE_CE_URL) against the in-process one, on one machine, and what clients see while the
remote stage is stopped or stalled.

Latency: two set-ups with the same models (bi-encoder, untrained CMC, the shipped cross-encoder) over the demo
index: `inproc` = one Sieve scoring the top cmc_k in-process; `remote` = a front Sieve sending them over HTTP (shape
sieve) to a second Sieve that serves the same cross-encoder. Blocks alternate inproc / remote, at 1 and at 4
concurrent clients; every request sends Cache-Control: no-cache. Reports p50 / p95 of the client-side latency and
of the server's own `ce` stage time, and remote / inproc ratios (the HTTP overhead).

Outage: 4 clients send /search with cross_encoder and timeout_ms to the front through phases: healthy, CE server
SIGSTOPped, CE server resumed, and a second front whose SIEVE_CE_URL is a server that stalls past every deadline
(tests/stub_reranker.py). Counts full answers, partial answers (`skipped: ["ce"]`) and errors (anything not 200).

    python benchmarks/remote_ce.py --out benchmarks/results/remote_ce.json
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from benchmarks.cmc_latency import machine  # noqa: E402
from sieve.index import read_beir_corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "sieve" / "demo_corpus.jsonl"
MODELS = {"SIEVE_CMC_PATH": "untrained", "SIEVE_CROSS_ENCODER_PATH": "shipped:cross-encoder",
          "SIEVE_CACHE_ENABLED": "false"}
HEADERS = {"Cache-Control": "no-cache"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": round(statistics.median(values), 1), "p95_ms": round(percentile(values, 95), 1)}


def post(client: httpx.Client, body: dict) -> tuple[float, dict | None]:
    started = time.perf_counter()
    try:
        response = client.post("/search", json=body, headers=HEADERS)
    except httpx.HTTPError:
        return (time.perf_counter() - started) * 1000, None
    elapsed = (time.perf_counter() - started) * 1000
    return elapsed, response.json() if response.status_code == 200 else None


def run_clients(server, queries: list[str], clients: int, per_client: int, body: dict) -> list[tuple[float, dict | None]]:
    """`clients` threads, each with its own keep-alive connection, each sending `per_client` requests."""
    def one(c: int):
        with server.client(timeout=300) as client:
            return [post(client, {"query": queries[(c * per_client + i) % len(queries)], **body})
                    for i in range(per_client)]

    with ThreadPoolExecutor(clients) as pool:
        return [r for part in pool.map(one, range(clients)) for r in part]


def latency(servers: dict, queries: list[str], body: dict, blocks: int, per_block: int) -> dict:
    out = {}
    for clients in (1, 4):
        client_ms = {name: [] for name in servers}
        stage_ms = {name: [] for name in servers}
        for block in range(blocks):
            order = list(servers) if block % 2 == 0 else list(reversed(servers))  # A B, B A, ...
            for name in order:
                for elapsed, answer in run_clients(servers[name], queries, clients, per_block, body):
                    assert answer is not None and not answer["partial"], f"{name}: {answer}"
                    client_ms[name].append(elapsed)
                    stage_ms[name].append(answer["timings_ms"]["ce"])
        rows = {name: {"client": summary(client_ms[name]), "ce_stage": summary(stage_ms[name])} for name in servers}
        rows["ratio_remote_to_inproc"] = {
            part: {p: round(rows["remote"][part][p] / rows["inproc"][part][p], 2) for p in ("p50_ms", "p95_ms")}
            for part in ("client", "ce_stage")}
        rows["overhead_ms"] = {part: {p: round(rows["remote"][part][p] - rows["inproc"][part][p], 1)
                                      for p in ("p50_ms", "p95_ms")} for part in ("client", "ce_stage")}
        out[f"{clients}_clients"] = rows
    return out


def counts(results: list[tuple[float, dict | None]]) -> dict:
    answers = [a for _, a in results if a is not None]
    return {"requests": len(results), "full": sum(1 for a in answers if not a["partial"]),
            "partial": sum(1 for a in answers if a["partial"] and a["skipped"] == ["ce"]),
            "errors": len(results) - len(answers), **summary([ms for ms, _ in results]),
            "max_ms": round(max(ms for ms, _ in results), 1)}


def metric(server, name: str, outcome: str) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        if line.startswith(f'{name}{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


def outage(front, ce, stall_front, queries: list[str], body: dict, per_client: int) -> dict:
    phases = {}
    phases["healthy"] = counts(run_clients(front, queries, 4, per_client, body))
    os.kill(ce.proc.pid, signal.SIGSTOP)
    try:
        phases["ce_stopped"] = counts(run_clients(front, queries, 4, per_client, body))
    finally:
        os.kill(ce.proc.pid, signal.SIGCONT)
    phases["ce_stopped"]["short_circuited_calls"] = metric(front, "sieve_remote_ce_calls_total", "short_circuited")
    time.sleep(12)  # past SIEVE_CE_BREAKER_OPEN_S (10): the next call is the probe
    before = metric(front, "sieve_remote_ce_calls_total", "short_circuited")
    phases["ce_resumed"] = counts(run_clients(front, queries, 4, per_client, body))
    # while the probe is out (half-open), the other clients' calls are refused at once: those answers are partial
    phases["ce_resumed"]["short_circuited_calls"] = metric(front, "sieve_remote_ce_calls_total", "short_circuited") - before
    phases["ce_stalled"] = counts(run_clients(stall_front, queries, 4, per_client, body))
    phases["ce_stalled"]["short_circuited_calls"] = metric(stall_front, "sieve_remote_ce_calls_total", "short_circuited")
    return phases


def table(result: dict) -> str:
    lines = ["| clients | set-up | client p50 | client p95 | ce stage p50 | ce stage p95 |", "|---|---|---:|---:|---:|---:|"]
    for clients, rows in result["latency"].items():
        for name in ("inproc", "remote"):
            r = rows[name]
            lines.append(f"| {clients.split('_')[0]} | {name} | {r['client']['p50_ms']} | {r['client']['p95_ms']} | "
                         f"{r['ce_stage']['p50_ms']} | {r['ce_stage']['p95_ms']} |")
        ratio = rows["ratio_remote_to_inproc"]
        lines.append(f"| {clients.split('_')[0]} | remote/inproc | {ratio['client']['p50_ms']}x | {ratio['client']['p95_ms']}x | "
                     f"{ratio['ce_stage']['p50_ms']}x | {ratio['ce_stage']['p95_ms']}x |")
    lines += ["", "| phase | requests | full | partial | errors | p50 ms | p95 ms | max ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for phase, c in result["outage"].items():
        lines.append(f"| {phase} | {c['requests']} | {c['full']} | {c['partial']} | {c['errors']} | {c['p50_ms']} | "
                     f"{c['p95_ms']} | {c['max_ms']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cmc-k", type=int, default=8, help="texts the cross-encoder scores per request (K')")
    parser.add_argument("--blocks", type=int, default=6, help="blocks per set-up and concurrency (alternating)")
    parser.add_argument("--per-block", type=int, default=10, help="requests per client per block")
    parser.add_argument("--outage-per-client", type=int, default=10)
    parser.add_argument("--timeout-ms", type=int, default=8000,
                        help="timeout_ms of the outage requests: above the healthy p95 at 4 clients on this machine")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from tests.server import Server, free_port
    from tests.stub_reranker import StubReranker

    queries = [doc.title for doc in read_beir_corpus(CORPUS)]
    body = {"top_k": 10, "retrieve_k": 50, "cmc_k": args.cmc_k, "cross_encoder": True}
    load_start = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, "-m", "sieve.cli", "index", "build", "--corpus", str(CORPUS), "--out",
                        str(tmp / "index")], check=True, cwd=REPO, env={**os.environ, "SIEVE_CACHE_DIR": str(tmp / "cache")})
        env = {"SIEVE_INDEX_DIR": str(tmp / "index"), **MODELS}
        started = []
        try:
            inproc = Server(env, tmp / "inproc.log")
            started.append(inproc)
            ce = Server(env, tmp / "ce.log")
            started.append(ce)
            front = Server({**env, "SIEVE_CE_URL": ce.url, "SIEVE_CE_SHAPE": "sieve"}, tmp / "front.log")
            started.append(front)
            servers = {"inproc": inproc, "remote": front}
            for name, server in servers.items():  # warm-up: thread pools, allocator, the CE server's batcher
                run_clients(server, queries, 4, 3, body)
            ready = httpx.get(f"{front.url}/readyz", timeout=30).json()
            result = {"latency": latency(servers, queries, body, args.blocks, args.per_block)}
            inproc.stop()
            started.remove(inproc)
            stub_port = free_port()
            stub = StubReranker(stub_port, "stall", tmp / "stub.log")
            stall_front = Server({**env, "SIEVE_CE_URL": f"http://127.0.0.1:{stub_port}", "SIEVE_CE_SHAPE": "tei"},
                                 tmp / "stall-front.log")
            started.append(stall_front)
            outage_body = {**body, "timeout_ms": args.timeout_ms}
            result["outage"] = outage(front, ce, stall_front, queries, outage_body, args.outage_per_client)
            stub.stop()
        finally:
            for server in started:
                server.stop()
    print(table(result))
    if args.out:
        doc = {"machine": {**machine(), "load_avg_end": list(os.getloadavg()), "load_avg_start": load_start,
                           "shared": "2 cores shared with 4 other engineers' work while this ran: absolute times are "
                                     "noisy; the interleaved ratios are the comparison"},
               "command": shlex.join(["python", *sys.argv]), "corpus": str(CORPUS.relative_to(REPO)),
               "index_size": ready["index_size"], "models": ready["models"], "body": body,
               "outage_timeout_ms": args.timeout_ms, "breaker": {"failures_to_open": 5, "open_s": 10, "retries": 2},
               **result}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
