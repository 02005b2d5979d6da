"""Hostile and oversized requests against a real `sieve serve` (issue 27): what each costs and how it is answered.
Starts its own server (shipped models, the demo corpus) from the source tree `--tree` (default: this one; point it
at another checkout to measure "before"), all traffic to 127.0.0.1, every loop bounded in count and time. Cases:
  big_rerank / big_v2_rerank: 1,000 documents of 5,000 characters (time, status, partial);
  pair_next_to_search: /search p50/p99 alone, then next to two big /rerank at once;
  pair_at_cap_next_to_search: the same next to two /rerank at the default SIEVE_RERANK_MAX_TOKENS (64 x 256 tokens);
  seven_mb: /rerank with one 7 MB document and timeout_ms 2000;
  header_100kb: a /search with 100 KB of headers;
  hangups: 50 clients that send half a /search body and close; the 500s and client_closed counted after;
  abandoned: a big /rerank whose client hangs up after 2 s: seconds until the server has nothing in flight;
  shutdown: SIGTERM with 20 slow-body connections open: seconds to exit.
Usage: python benchmarks/hostile.py --out benchmarks/results/hostile.json [--tree /work/main] [--cases a,b]
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cmc_latency import machine  # noqa: E402
from tests.server import REPO, Server  # noqa: E402

BIG = {"query": "what causes inflammation", "documents": [f"document {i} " + "lorem ipsum dolor sit amet " * 185
                                                          for i in range(1000)]}
AT_CAP = {"query": "what causes inflammation", "documents": [f"document {i} " + "lorem ipsum dolor sit amet " * 40
                                                             for i in range(64)]}  # 64 x 256 tokens = the default cap
CASES = ("big_rerank", "big_v2_rerank", "pair_next_to_search", "pair_at_cap_next_to_search", "seven_mb", "header_100kb", "hangups", "abandoned",
         "shutdown")


def timed_post(client: httpx.Client, path: str, body: dict, **kw) -> dict:
    started = time.perf_counter()
    try:
        r = client.post(path, json=body, **kw)
        out = {"status": r.status_code, "partial": r.json().get("partial") if r.status_code == 200 else None,
               "error": r.json().get("error", {}).get("code") if r.status_code >= 400 else None}
    except httpx.HTTPError as exc:
        out = {"status": None, "error": type(exc).__name__}
    return out | {"seconds": round(time.perf_counter() - started, 2)}


def search_latencies(client: httpx.Client, n: int, stop: threading.Event | None = None) -> list[float]:
    times = []
    for i in range(n):
        if stop is not None and stop.is_set():
            break
        started = time.perf_counter()
        client.post("/search", json={"query": f"inflammation cause {i}", "top_k": 10},
                    headers={"Cache-Control": "no-cache"})
        times.append((time.perf_counter() - started) * 1000)
    return times


def p(values: list[float], q: float) -> float | None:
    return round(sorted(values)[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))], 1) if values else None


def pair_next_to_search(server: Server, body: dict = BIG) -> dict:
    with server.client(timeout=300) as client:
        alone = search_latencies(client, 40)
        results, stop = [], threading.Event()
        threads = [threading.Thread(target=lambda: results.append(timed_post(server.client(timeout=300), "/rerank", body)))
                   for _ in range(2)]
        for t in threads:
            t.start()
        during = []
        loader = threading.Thread(target=lambda: during.extend(search_latencies(server.client(timeout=300), 400, stop)))
        loader.start()
        for t in threads:
            t.join(timeout=400)
        stop.set()
        loader.join(timeout=300)
    return {"search_alone": {"n": len(alone), "p50_ms": p(alone, 50), "p99_ms": p(alone, 99)},
            "search_during": {"n": len(during), "p50_ms": p(during, 50), "p99_ms": p(during, 99),
                              "max_ms": round(max(during), 1) if during else None},
            "reranks": results}


def pair_at_cap_next_to_search(server: Server) -> dict:
    """Two of the largest /rerank the default cap admits (64 x 256 tokens) next to /search."""
    return pair_next_to_search(server, AT_CAP)


def header_100kb(server: Server) -> dict:
    headers = {f"x-pad-{i}": "x" * 1000 for i in range(100)}
    with server.client() as client:
        try:
            return {"status": client.post("/search", json={"query": "q"}, headers=headers).status_code}
        except httpx.HTTPError as exc:
            return {"status": None, "error": type(exc).__name__}


def metric_lines(server: Server, pattern: str) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if re.match(pattern, line)}


def hangups(server: Server) -> dict:
    before = metric_lines(server, r"sieve_requests_total\{")
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
                     b"\r\n" + b'{"query": "' + b"a" * 100)
        sock.close()
    time.sleep(2)
    after = metric_lines(server, r"sieve_requests_total\{")
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0 and "/metrics" not in k}
    log = server.log_path.read_text()
    return {"requests_total_delta": delta, "unhandled_errors_logged": log.count("unhandled error")}


def inflight(server: Server) -> float:
    return next(iter(metric_lines(server, r"sieve_inflight_requests ").values()), 0.0)


def abandoned(server: Server) -> dict:
    body = json.dumps(BIG).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(2)
    sock.close()
    closed = time.perf_counter()
    while inflight(server) > 0 and time.perf_counter() - closed < 300:
        time.sleep(0.5)
    return {"busy_after_hangup_s": round(time.perf_counter() - closed, 1)}


def shutdown(server: Server) -> dict:
    socks = []
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
                     b"\r\n{")
        socks.append(sock)
    time.sleep(1)
    started = time.perf_counter()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=60)
    except Exception:  # noqa: BLE001 - report it, then kill
        server.proc.kill()
    for sock in socks:
        sock.close()
    return {"exit_s": round(time.perf_counter() - started, 2), "returncode": server.proc.returncode}


def run_case(name: str, server: Server) -> dict:
    if name == "big_rerank":
        with server.client(timeout=300) as c:
            return timed_post(c, "/rerank", BIG)
    if name == "big_v2_rerank":
        with server.client(timeout=300) as c:
            return timed_post(c, "/v2/rerank", {**BIG, "model": "rerank-v3.5"})
    if name == "seven_mb":
        with server.client(timeout=300) as c:
            return timed_post(c, "/rerank", {"query": "q", "documents": ["word " * 1_400_000], "timeout_ms": 2000})
    return globals()[name](server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=REPO, help="source tree whose sieve is served")
    parser.add_argument("--index", type=Path, default=Path(tempfile.gettempdir()) / "sieve-hostile-index")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not args.index.exists():
        import torch

        from sieve.index import build_index, read_beir_corpus
        from sieve.service.components import load_biencoder
        from sieve.service.config import Settings

        settings = Settings()
        build_index(read_beir_corpus(REPO / "sieve" / "demo_corpus.jsonl"), load_biencoder(settings, torch.device("cpu")),
                    args.index, progress=False, lexical=settings.lexical_config())
    results = {}
    with tempfile.TemporaryDirectory() as logs:
        for name in args.cases.split(","):
            server = Server({"SIEVE_INDEX_DIR": str(args.index)}, Path(logs) / f"{name}.log", shipped_models=True,
                            cwd=args.tree)
            try:
                results[name] = run_case(name, server)
            finally:
                if server.proc.poll() is None:
                    server.stop()
            print(name, json.dumps(results[name]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine(), "tree": str(args.tree), "command": " ".join(sys.argv),
                                        "cases": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
