"""Where a default /search spends server CPU outside the model forwards: the app driven in this process over ASGI
(no sockets, no uvicorn), zero-cost forwards (benchmarks/zero_cost.py), `--concurrency` requests at once. Reports
CPU per request by thread (event loop, request threads, batchers, native threads) and, for the functions of the
request path listed in TIMED, their thread CPU per request (inclusive: a function's time includes what it calls).

    python benchmarks/overhead_breakdown.py --index ../idx/scifact --out benchmarks/results/overhead_breakdown.json
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import functools
import importlib
import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
TIMED = [("sieve.pipeline.searcher", "Searcher.search"), ("sieve.pipeline.searcher", "Searcher.new_state"),
         ("sieve.models.text_encoder", "TextEncoder.count_tokens"),
         ("sieve.pipeline.searcher", "Searcher.encode_query"),
         ("sieve.pipeline.first_stage", "HybridRetrieve.__call__"),
         ("sieve.index.search_index", "SearchIndex.search"), ("sieve.index.search_index", "SearchIndex.lexical_scores"),
         ("sieve.index.search_index", "SearchIndex.embeddings"),
         ("sieve.pipeline.first_stage", "rrf_fuse"), ("sieve.pipeline.first_stage", "top_positive"),
         ("sieve.pipeline.stages", "CMCRerank.prepare"), ("sieve.pipeline.stages", "features"),
         ("sieve.pipeline.stages", "CMCRerank.finish"), ("sieve.service.routes", "search_body"),
         ("sieve.pipeline.batching", "Batcher.run"), ("sieve.models.text_encoder", "TextEncoder.encode_queries"),
         ("sieve.models.text_encoder", "TextEncoder.tokenize_counted"),
         ("sieve.index.search_index", "SearchIndex.search_scored"), ("sieve.index.device_flat", "top_k"),
         ("sieve.pipeline.stages", "CMCRerank.compute_each"), ("sieve.pipeline.packing", "pad_lists"),
         ("sieve.pipeline.stages", "CMCRerank.forward"), ("sieve.service.routes", "body_json")]
SPENT: collections.Counter = collections.Counter()


def timed(module: str, qualname: str) -> None:
    """Wrap one function so its thread CPU time adds up in SPENT (skipped when the tree has no such function)."""
    mod = importlib.import_module(module)
    owner, name = (getattr(mod, qualname.split(".")[0]), qualname.split(".")[1]) if "." in qualname else (mod, qualname)
    fn = getattr(owner, name, None)
    if fn is None:
        return

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[qualname] += time.thread_time() - started
    setattr(owner, name, wrapper)


def thread_ticks() -> dict[str, int]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = int(fields[11]) + int(fields[12])
    return out


def by_thread(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    groups: collections.Counter = collections.Counter()
    for tid, ticks in after.items():
        name = names.get(tid, "native (OpenMP, tokenizers)")
        name = "request threads" if name.startswith(("AnyIO", "Thread-", "search_")) else name.split(":")[0]
        groups[name] += ticks - before.get(tid, 0)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    return {k: round(v * tick_ms / n, 3) for k, v in groups.most_common() if v}


async def call(app, body: bytes) -> int:
    sent, done, status = [{"type": "http.request", "body": body, "more_body": False}], asyncio.Event(), []

    async def receive():
        if sent:
            return sent.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()
    headers = [(b"host", b"bench"), (b"content-type", b"application/json"), (b"cache-control", b"no-cache"),
               (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/search", "raw_path": b"/search", "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("bench", 80), "state": {}}
    await app(scope, receive, send)
    return status[0]


async def drive(app, bodies: list[bytes], n: int, concurrency: int) -> None:
    left = iter(range(n))

    async def client():
        for i in left:
            assert await call(app, bodies[i % len(bodies)]) == 200
    await asyncio.gather(*(client() for _ in range(concurrency)))


async def measure(app, bodies: list[bytes], args) -> list[dict]:
    rows = []
    async with app.router.lifespan_context(app):
        await drive(app, bodies, 100, args.concurrency)  # warm-up
        for _ in range(args.rounds):
            SPENT.clear()
            before, cpu = thread_ticks(), time.process_time()
            await drive(app, bodies, args.requests, args.concurrency)
            rows.append({"cpu_ms_per_request": round(1000 * (time.process_time() - cpu) / args.requests, 3),
                         "by_thread": by_thread(before, thread_ticks(), args.requests),
                         "by_function": {k: round(1000 * v / args.requests, 3) for k, v in SPENT.most_common()},
                         "load_avg_1m": round(os.getloadavg()[0], 2)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, default=REPO.parent / "idx" / "scifact")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import zero_cost

    zero_cost.install()
    for module, qualname in TIMED:
        timed(module, qualname)
    from benchmarks.cmc_latency import machine
    from benchmarks.overhead import query_bodies
    from sieve.service.app import create_app
    from sieve.service.components import load_components
    from sieve.service.config import Settings

    path = Path("/tmp") / f"overhead-bodies-{os.getpid()}.jsonl"
    query_bodies(path)
    bodies = [line.encode() for line in path.read_text().splitlines()]
    # as `sieve serve` runs it: the start-up heap frozen, the collector's pauses timed (service/heap.py)
    app = create_app(Settings(index_dir=args.index, log_level="warning"), loader=load_components, served_process=True)
    rows = asyncio.run(measure(app, bodies, args))
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "rows": rows, "index": str(args.index),
                                        "concurrency": args.concurrency, "requests": args.requests,
                                        "command": shlex.join(["python", *sys.argv]),
                                        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")},
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
