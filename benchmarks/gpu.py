"""Sieve on one CUDA machine (issue 32): real `sieve serve` processes measured from outside by closed-loop clients on
loopback, plus in-process kernel figures (benchmarks/gpu_micro.py), written to benchmarks/results/gpu_<device>.json
(the device, CPU count, versions) after every cell, so a run cut short keeps what it measured.

Sections (--sections, run in the order given; each server is started, measured and stopped on its own):
  build    `sieve index build` of the corpus (SciFact x --reps, ids suffixed) on the device: documents per second;
           then, untimed, `sieve index add-store --ce-tokens` (a /search with the CE then tokenizes only its query)
  micro    cross-encoder forward alone (100 / 512 pairs) and its tokenization, CMC forward vs K 512 / 10,000 / 16,384,
           FAISS vs the device's flat search, the start-up calibration and the limits it puts in force
  serve    the default /search (hybrid -> CMC over 512, top_k 10) at 1 / 16 / 64 clients with per-stage means from
           /metrics; the same with the cross-encoder on the top 16 at 16 and 64 clients; /rerank of 100 documents
           with the cross-encoder at 1 and 8 clients (pairs/s); /search with CMC over 16,384 candidates (retriever
           be), p50 at one client
  papercmc the paper-style CMC (two attention layers; the shipped default is an MLP over the evidence, which costs
           nothing at any K): /search retriever be -> CMC over 512 at 1 and 16 clients, over 16,384 at 1
  nobatch  the default /search at 16 clients with SIEVE_BATCHING=false
  cpu      the same machine's CPU mode (SIEVE_DEVICE=cpu): default /search at 16 and 64 clients, /rerank 100 at 1:
           the ratios
  cpufp32  the CPU mode with SIEVE_PRECISION=fp32, default /search at 16 and 64 clients, and the device over it (on
           the H200 machine's CPU the bf16 query tower took 1.6-2.5 s per /search under load:
           benchmarks/results/gpu_nvidia_h200{,_s38}.json)
  zerocost the machine's serving ceiling on its CPUs: benchmarks/zero_cost.py (the model forwards replaced by stand-ins
           that cost ~nothing, SIEVE_DEVICE=cpu) with --zerocost-workers workers (default half the CPUs, the automatic
           count on the H200 machine), the default /search at 16 / 64 / 128 clients: what the CPU side alone can answer
  workers  `sieve serve --workers N` for each N of --workers (1, 2, 4, 8): the default /search at 64 and 128 clients
           (the other sections run SIEVE_WORKERS unset: the automatic count, which /readyz `workers` records)

Servers run with the result cache off, SIEVE_MAX_INFLIGHT=512, a 60 s deadline and no work cap (what is measured
is throughput, not the protection; /readyz of every server is kept, and `micro` records the limits the device
would put in force by default). Every request sends `Cache-Control: no-cache`.

The client: each cell's closed-loop clients (client i sends body i*37, i*37+1, ... as soon as its previous reply is
in) run as asyncio tasks, each on its own keep-alive connection written and read as bytes (--client raw, RawClient;
--client httpx: one httpx.AsyncClient per process, as the thirty-fifth session's run and the issue's own figures
had), spread over --client-procs spawned processes (default ceil(clients / 8), at most half the CPUs; 0 or 1: the
clients run in this process). httpx's client took 2.4-9.2 ms of a Zen 4 core per /search against 0.11-0.15 ms for
the raw one, and against one zero-cost server it sent 101-263 /search a second where the raw one sent 880-1,153
(benchmarks/client_cost.py, client_cost_zen4.json): the H200 run's 184 QPS at 64 clients, with a client p50 of 219
ms against the servers' 27 ms, was most likely its client's. All processes warm up, wait at a barrier while this one
reads /metrics, measure the same window, and send back latencies, status codes and their CPU time: a row's
client_cpu_s_per_request and client_busy_max (the busiest client process's share of one core) show whether the
client kept up.

--spy S: py-spy (carried by gpu_prepare.sh) records the server and its workers for the first S seconds of the
measured window of the cells --spy-cells names (by default the two 64-client /search cells the targets missed on
the H200); a row's `spy` sums the running threads' samples by frame, and the raw stacks stay in --work.

    python benchmarks/gpu.py                                  # on a CUDA machine, from the repository root
    python benchmarks/gpu.py --device cpu --quick --ndocs 300 --reps 1 --workers 2 --out /tmp/gpu_smoke.json
benchmarks/gpu_prepare.sh + gpu_run.sh carry the repository to a CUDA machine without registry access and run it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import platform
import random
import re
import resource
import shutil
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
SECTIONS = ("build", "micro", "serve", "papercmc", "nobatch", "cpu", "cpufp32", "zerocost", "workers")
DEFAULT = {}  # the default /search: the server's retriever, reranker and top_k 10
DEFAULT_CE = {"cross_encoder": True, "cmc_k": 16}  # the default /search with the cross-encoder on its top 16
BE_CMC = {"retriever": "be", "rerank": "cmc", "cross_encoder": False}  # retrieve_k 512 by default
BE_CMC_16384 = {**BE_CMC, "retrieve_k": 16384}


class Run:
    """The result file, rewritten after every cell."""

    def __init__(self, out: Path, meta: dict):
        self.out, self.data = out, {**meta, "cells": [], "servers": {}, "errors": []}
        out.parent.mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self) -> None:
        self.out.write_text(json.dumps(self.data, indent=1))

    def error(self, what: str) -> None:
        print("ERROR", what, flush=True)
        self.data["errors"].append(what)
        self.save()


def machine(device: str) -> dict:
    probe = ("import json, sys, torch, transformers, faiss, fastapi, numpy; "
             "print(json.dumps({'python': sys.version.split()[0],"
             " 'torch': torch.__version__, 'transformers': transformers.__version__, 'faiss': faiss.__version__,"
             " 'fastapi': fastapi.__version__, 'numpy': numpy.__version__, 'cuda': torch.version.cuda,"
             " 'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,"
             " 'faiss_gpus': getattr(faiss, 'get_num_gpus', lambda: 0)()}))")
    versions = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                         check=True).stdout)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    if not commit and (REPO / "COMMIT").exists():  # a packed tree (gpu_prepare.sh) records its commit
        commit = (REPO / "COMMIT").read_text().strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else None
    return {"device": device, "gpu": versions.pop("gpu"), "cpu": cpu, "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "versions": versions, "commit": commit or None,
            "load_avg_start": list(os.getloadavg())}


def sieve_bin() -> str:
    """The `sieve` command: SIEVE_BIN (gpu_run.sh installs into a --target directory), else the one beside python."""
    return os.environ.get("SIEVE_BIN") or str(Path(sys.executable).parent / "sieve")


def server_env(args, device: str, extra: dict | None = None) -> dict:
    env = dict(os.environ, SIEVE_DEVICE=device, SIEVE_INDEX_DIR=str(args.index), SIEVE_CACHE_ENABLED="false",
               SIEVE_MAX_INFLIGHT="512", SIEVE_LOG_LEVEL="warning", SIEVE_DEFAULT_TIMEOUT_MS="60000",
               SIEVE_RERANK_MAX_TOKENS="100000000", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if args.models:  # gpu-check's layout: be/, ce/, cmc-fusion/
        env.update(SIEVE_MODEL_PATH=str(args.models / "be"), SIEVE_CROSS_ENCODER_PATH=str(args.models / "ce"),
                   SIEVE_CMC_PATH=str(args.models / "cmc-fusion"))
    return {**env, **(extra or {})}


def start(run: Run, name: str, env: dict, port: int, workers: int | None, logs: Path, zero_cost: bool = False):
    """`sieve serve` (or, zero_cost, benchmarks/zero_cost.py: the same server with its model forwards replaced by
    stand-ins costing ~nothing, on SIEVE_PORT) on `port`, once /readyz answers 200; None if it never does."""
    if zero_cost:
        cmd = [sys.executable, str(Path(__file__).with_name("zero_cost.py")), "--workers", str(workers or 1)]
        env = {**env, "SIEVE_PORT": str(port)}
    else:
        cmd = [sieve_bin(), "serve", "--port", str(port)]
        if workers:
            cmd += ["--workers", str(workers)]
    t0, log = time.time(), open(logs / f"serve-{name}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
    ready = None
    for _ in range(1200):
        if proc.poll() is not None:
            break
        try:
            reply = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
            if reply.status_code == 200:
                ready = reply.json()
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    run.data["servers"][name] = {"device": env["SIEVE_DEVICE"], "workers": workers,
                                 "start_s": round(time.time() - t0, 1), "readyz": ready, "exit": proc.poll()}
    run.save()
    if ready is None:
        stop(proc)
        run.error(f"{name} did not become ready: {(logs / f'serve-{name}.log').read_text()[-2000:]}")
        return None
    return proc


def stop(proc) -> None:
    try:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, 9)


def stage_sums(port: int) -> dict:
    """Sum and count of every *_seconds histogram on /metrics, by its labels."""
    out = {}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        if not line.startswith("#") and "_seconds_" in line:
            key, _, value = line.rpartition(" ")
            if key.split("{")[0].endswith(("_sum", "_count")):
                out[key] = float(value)
    return out


def stage_means(before: dict, after: dict) -> dict:
    means = {}
    for key, value in after.items():
        if key.split("{")[0].endswith("_sum") and key in before:
            count = key.replace("_sum", "_count", 1)
            n = after.get(count, 0) - before.get(count, 0)
            if n > 0:
                means[key.replace("_sum", "")] = {"mean_ms": round(1000 * (value - before[key]) / n, 3), "n": int(n)}
    return means


@dataclass(frozen=True)
class Bodies:
    """Request body j of a cell: /search of query j (`extra` added), or /rerank of `n` of `docs` when n > 0.
    A class, not a lambda, so that spawned client processes receive it."""
    queries: list
    extra: dict
    docs: list = ()
    n: int = 0

    def __call__(self, j: int) -> dict:
        query = self.queries[j % len(self.queries)]
        if not self.n:
            return {"query": query, "top_k": 10, **self.extra}
        return {"query": query, "model": "ce", "top_n": 10,
                "documents": [self.docs[(j * 101 + i * 7) % len(self.docs)] for i in range(self.n)]}


class HttpxClient:
    """One closed-loop client's view of a shared httpx.AsyncClient (--client httpx): send() as RawClient's."""

    def __init__(self, http: httpx.AsyncClient, url: str):
        self.http, self.url = http, url

    async def send(self, body: dict) -> str:
        try:
            reply = await self.http.post(self.url, json=body, headers={"Cache-Control": "no-cache"})
        except httpx.HTTPError as exc:
            return type(exc).__name__
        code = str(reply.status_code)
        return "200-partial" if code == "200" and reply.json().get("partial") else code

    def close(self) -> None:
        pass


async def closed_loop(connect, bodies, ids, seconds: float, lat: list, codes: dict) -> None:
    """Clients `ids`, each on connect() (a RawClient or an HttpxClient), sending body i*37, i*37+1, ... as soon as
    its previous reply is in, for `seconds`: each reply's latency and its code (RawClient.post's) counted."""
    until = time.perf_counter() + seconds

    async def client(i: int) -> None:
        j, conn = i * 37, connect()
        try:
            while time.perf_counter() < until:
                body, j = bodies(j), j + 1
                t = time.perf_counter()
                code = await conn.send(body)
                lat.append(time.perf_counter() - t)
                codes[code] = codes.get(code, 0) + 1
        finally:
            conn.close()

    await asyncio.gather(*(client(i) for i in ids))


class RawClient:
    """A closed-loop client on one keep-alive HTTP/1.1 connection over asyncio streams: the request bytes written as
    they are, the reply read by its Content-Length. About a tenth of httpx's client CPU per request (httpx.AsyncClient
    took 2.5 ms of a Zen 4 core per /search at 16 clients and 3.5 ms at 64, so one process could not send more than
    ~300 /search a second: RESULTS.md, issue 32). A reply without Content-Length, a dropped connection or a timeout is
    counted by its kind and the connection opened again."""

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                     "Cache-Control: no-cache\r\nContent-Length: ").encode()
        self.reader = self.writer = None

    async def post(self, body: bytes, timeout: float = 300.0) -> str:
        """The reply's status code ("200-partial": a 200 whose answer says partial: true) or the error's name."""
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
            length = re.search(rb"(?im)^content-length:[ \t]*(\d+)", head)
            if length is None:
                self.close()
                return "no-content-length"
            reply = await asyncio.wait_for(self.reader.readexactly(int(length.group(1))), timeout)
            code = head[9:12].decode()
            if re.search(rb"(?im)^connection:[ \t]*close", head):
                self.close()
            return "200-partial" if code == "200" and b'"partial":true' in reply else code
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as exc:
            self.close()
            return type(exc).__name__

    async def send(self, body: dict) -> str:
        return await self.post(json.dumps(body).encode())

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def raw_closed_loop(url: str, bodies, ids, seconds: float, lat: list, codes: dict) -> None:
    """closed_loop() with a RawClient per client."""
    await closed_loop(lambda: RawClient(url), bodies, ids, seconds, lat, codes)


def cpu_s() -> float:
    """This process's user + system CPU seconds."""
    return sum(resource.getrusage(resource.RUSAGE_SELF)[:2])


def clients_window(url: str, bodies, ids, warm_s: float, measure_s: float, between, kind: str = "raw") -> dict:
    """Clients `ids` in this process (`kind` raw: a RawClient each; httpx: one httpx connection pool): the warm-up,
    `between()`, then the measured window (its latencies, status codes, length and this process's CPU seconds)."""
    out = {"lat": [], "codes": {}}

    async def window(connect) -> None:
        await closed_loop(connect, bodies, ids, warm_s, [], {})
        between()
        cpu0, t0 = cpu_s(), time.perf_counter()
        await closed_loop(connect, bodies, ids, measure_s, out["lat"], out["codes"])
        out["seconds"], out["cpu_s"] = time.perf_counter() - t0, cpu_s() - cpu0

    async def both() -> None:
        if kind == "raw":
            return await window(lambda: RawClient(url))
        limits = httpx.Limits(max_connections=len(ids) + 4, max_keepalive_connections=len(ids) + 4)
        async with httpx.AsyncClient(timeout=300, limits=limits) as http:
            await window(lambda: HttpxClient(http, url))

    asyncio.run(both())
    return out


def client_proc(url: str, bodies, ids, warm_s: float, measure_s: float, barrier, queue, kind: str) -> None:
    """A spawned client process: warm up, wait while the parent reads /metrics (between two barriers), measure."""
    try:
        queue.put(clients_window(url, bodies, ids, warm_s, measure_s, lambda: (barrier.wait(), barrier.wait()), kind))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        barrier.abort()
        queue.put({"error": repr(exc)})


def client_procs(args, clients: int) -> int:
    """--client-procs, by default ceil(clients / 8) at most half the CPUs; never more than the clients."""
    procs = args.client_procs
    if procs is None:
        procs = min(math.ceil(clients / 8), (os.cpu_count() or 2) // 2)
    return max(1, min(procs, clients))


def run_clients(url: str, bodies, clients: int, procs: int, args, port: int,
                at_start=lambda: None) -> tuple[list, dict, dict]:
    """The warm-up and the measured window of `clients` clients over `procs` processes: each process's
    clients_window() and the /metrics sums just before and after the window; at_start() as the window starts."""
    before = {}
    if procs == 1:
        outs = [clients_window(url, bodies, range(clients), args.warm_s, args.measure_s,
                               lambda: (before.update(stage_sums(port)), at_start()), args.client)]
        return outs, before, stage_sums(port)
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(procs + 1, timeout=120 + args.warm_s), ctx.Queue()
    children = [ctx.Process(target=client_proc, args=(url, bodies, range(p, clients, procs), args.warm_s,
                                                      args.measure_s, barrier, queue, args.client), daemon=True)
                for p in range(procs)]
    for child in children:
        child.start()
    try:
        barrier.wait()  # every process warmed up
        before = stage_sums(port)
        barrier.wait()  # the window starts
        at_start()
        outs = [queue.get(timeout=300 + args.measure_s) for _ in children]
        after = stage_sums(port)
    except Exception as exc:
        barrier.abort()
        errors = []
        try:  # what the processes that failed said
            while True:
                errors.append(queue.get(timeout=2).get("error"))
        except Exception:  # noqa: BLE001 - queue.Empty
            pass
        raise RuntimeError(f"client processes: {exc!r} {[e for e in errors if e]}") from exc
    finally:
        for child in children:
            child.join(10)
            if child.is_alive():
                child.terminate()
    failed = [o["error"] for o in outs if "error" in o]
    if failed:
        raise RuntimeError(f"client processes failed: {failed}")
    return outs, before, after


class Spy:
    """py-spy over the server and its workers (--subprocesses) for the first seconds of a cell's measured window:
    the stacks of the threads that were running (idle ones left out), written as py-spy's raw collapsed stacks and
    summed in the row by the frame they were running (self) and the deepest Sieve frame under it."""

    def __init__(self, pid: int, seconds: float, out: Path):
        self.pid, self.seconds, self.out, self.proc, self.error = pid, seconds, out, None, "not started"

    def start(self) -> None:
        spy = shutil.which("py-spy")
        if spy is None:
            self.error = "py-spy not found"
            return
        self.proc = subprocess.Popen([spy, "record", "--pid", str(self.pid), "--subprocesses", "--nonblocking",
                                      "--rate", "200", "--duration", str(max(1, round(self.seconds))),
                                      "--format", "raw", "--output", str(self.out)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish(self) -> dict:
        if self.proc is None:
            return {"error": self.error}
        try:
            said = self.proc.communicate(timeout=60 + self.seconds)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            said = self.proc.communicate()[0]
        if not self.out.exists():
            return {"error": said[-500:]}
        return {"file": self.out.name, "seconds": self.seconds, **spy_summary(self.out.read_text())}


def spy_summary(collapsed: str, top: int = 25) -> dict:
    """Samples by the frame running (self) and by the deepest frame in Sieve's code, from raw collapsed stacks."""
    own, sieve, total = {}, {}, 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        mine = next((f for f in reversed(frames) if "(sieve/" in f or "/sieve/" in f), "(outside sieve)")
        sieve[mine] = sieve.get(mine, 0) + n
    best = lambda d: [[k, v] for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]  # noqa: E731
    return {"samples": total, "self": best(own), "sieve_frame": best(sieve)}


def cell(run: Run, args, name: str, server: str, port: int, path: str, bodies, nominal: int,
         per_request: int = 1, pid: int | None = None) -> dict:
    """One measured window at `nominal` clients (a --quick run caps them at 4) over client_procs() processes; with
    --spy, py-spy over the server for the first seconds of the window of the cells --spy-cells names."""
    url = f"http://127.0.0.1:{port}{path}"
    clients = min(nominal, 4) if args.quick else nominal
    procs = client_procs(args, clients)
    spy = None
    if args.spy and pid and f"{server}/{name}@{nominal}" in args.spy_cells.split(","):
        spy = Spy(pid, min(args.spy, args.measure_s), args.work / f"spy-{server}-{name}-{nominal}.txt")
    outs, before, after = run_clients(url, bodies, clients, procs, args, port, spy.start if spy else lambda: None)
    wall = max(o["seconds"] for o in outs)
    lat, codes, client_cpu = sorted(x for o in outs for x in o["lat"]), {}, sum(o["cpu_s"] for o in outs)
    for o in outs:
        for code, n in o["codes"].items():
            codes[code] = codes.get(code, 0) + n
    pct = lambda q: round(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], 2) if lat else None  # noqa: E731
    ok = codes.get("200", 0) / wall
    row = {"cell": name, "server": server, "path": path, "nominal_clients": nominal, "clients": clients,
           "n": len(lat), "seconds": round(wall, 2),
           "qps": round(len(lat) / wall, 2), "ok_qps": round(ok, 2), "p50_ms": pct(0.5), "p95_ms": pct(0.95),
           "p99_ms": pct(0.99), "codes": codes, "stage_means": stage_means(before, after),
           "load_avg": list(os.getloadavg()), "client": args.client, "client_procs": procs,
           "client_cpu_s_per_request": round(client_cpu / len(lat), 5) if lat else None,
           "client_busy_max": round(max(o["cpu_s"] / o["seconds"] for o in outs), 3)}
    if per_request > 1:
        row["pairs_per_s"] = round(ok * per_request, 1)
    if spy is not None:
        row["spy"] = spy.finish()
    run.data["cells"].append(row)
    run.save()
    print(json.dumps({k: row.get(k) for k in ("cell", "server", "clients", "client_procs", "qps", "p50_ms", "p99_ms",
                                              "pairs_per_s", "client_busy_max", "codes")}), flush=True)
    return row


def texts(path: Path, n: int) -> list[str]:
    rows = [json.loads(line) for line, _ in zip(open(path), range(n))]
    return [(r.get("title", "") + " " + r["text"]).strip() for r in rows]


def searches(queries: list[str], extra: dict) -> Bodies:
    return Bodies(queries, extra)


def reranks(queries: list[str], docs: list[str], n: int) -> Bodies:
    return Bodies(queries, {}, docs, n)


def serve_section(run: Run, args, name: str, device: str, cells: list, extra_env: dict | None = None,
                  workers: int | None = None, zero_cost: bool = False) -> None:
    port = args.port + len(run.data["servers"])
    proc = start(run, name, server_env(args, device, extra_env), port, workers, args.work, zero_cost)
    if proc is None:
        return
    try:
        for cname, path, bodies, clients, per_request in cells:
            try:
                cell(run, args, cname, name, port, path, bodies, clients, per_request, proc.pid)
            except Exception as exc:  # noqa: BLE001 - one failed cell must not lose the others
                run.error(f"{name}/{cname}@{clients}: {exc!r}")
    finally:
        stop(proc)
        run.data["servers"][name]["log_tail"] = (args.work / f"serve-{name}.log").read_text()[-1500:]
        run.save()


def build_section(run: Run, args) -> None:
    corpus = args.work / "corpus.jsonl"
    rows = [json.loads(line) for line, _ in zip(open(args.corpus), range(args.ndocs))]
    with open(corpus, "w") as f:
        for r in range(args.reps):
            for d in rows:
                f.write(json.dumps({**d, "_id": f"{d['_id']}-{r}"}) + "\n")
    docs = len(rows) * args.reps
    env = server_env(args, args.device, {"SIEVE_ENCODE_BATCH_SIZE": "256" if args.device != "cpu" else "32"})
    t0 = time.perf_counter()
    done = subprocess.run([sieve_bin(), "index", "build", "--corpus", str(corpus), "--out",
                           str(args.index)], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    reply = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1:] or [{}]
    run.data["build"] = {"documents": docs, "seconds_with_start_up": round(seconds, 1),
                         "docs_per_s": round(docs / seconds, 1), "exit": done.returncode,
                         "parts_s": reply[0].get("seconds"), "document_precision": reply[0].get("document_precision"),
                         "log_tail": done.stderr[-1500:]}
    run.save()
    if done.returncode != 0:
        run.error(f"index build failed: {done.stderr[-2000:]}")
    elif not args.no_ce_tokens:  # untimed: the cross-encoder's token ids, so a /search with it tokenizes only its query
        t0 = time.perf_counter()
        added = subprocess.run([sieve_bin(), "index", "add-store", "--index", str(args.index), "--ce-tokens"],
                               env=env, capture_output=True, text=True)
        run.data["build"]["ce_tokens_s"] = round(time.perf_counter() - t0, 1)
        if added.returncode != 0:
            run.error(f"index add-store --ce-tokens failed: {added.stderr[-2000:]}")
        run.save()
    print(json.dumps({k: v for k, v in run.data["build"].items() if k != "log_tail"}), flush=True)


def micro_section(run: Run, args) -> None:
    out = args.work / "micro.json"
    env = server_env(args, args.device)
    for key in ("SIEVE_DEFAULT_TIMEOUT_MS", "SIEVE_RERANK_MAX_TOKENS"):  # the limits the device puts in force
        env.pop(key)
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_micro.py"), "--device", args.device,
                           "--queries", str(args.queries), "--corpus", str(args.corpus), "--out", str(out),
                           *(["--reps", "2", "--ks", "512,2048", "--pairs", "16"] if args.quick else [])],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        run.error(f"micro failed: {done.stderr[-2000:]}")
        return
    run.data["micro"] = json.loads(out.read_text())
    run.save()


def ratios(run: Run) -> dict:
    """The figures issue 32 asks for side by side: device over the same machine's CPU, N workers over one."""
    def find(server: str, cname: str, clients: int, key: str):
        return next((c.get(key) for c in run.data["cells"] if (c["server"], c["cell"], c["nominal_clients"]) ==
                     (server, cname, clients)), None)

    def ratio(a, b):
        return round(a / b, 2) if a and b else None

    out = {"search_16_device_over_cpu": ratio(find("device", "default", 16, "ok_qps"),
                                              find("cpu", "default", 16, "ok_qps")),
           "search_64_device_over_cpu": ratio(find("device", "default", 64, "ok_qps"),
                                              find("cpu", "default", 64, "ok_qps")),
           # against the CPU mode in fp32 too: on the H200 machine's CPU its bf16 query tower stalled under load
           "search_16_device_over_cpufp32": ratio(find("device", "default", 16, "ok_qps"),
                                                  find("cpufp32", "default", 16, "ok_qps")),
           "search_64_device_over_cpufp32": ratio(find("device", "default", 64, "ok_qps"),
                                                  find("cpufp32", "default", 64, "ok_qps")),
           "rerank100_1_device_over_cpu": ratio(find("device", "rerank-ce-100", 1, "pairs_per_s"),
                                                find("cpu", "rerank-ce-100", 1, "pairs_per_s")),
           "search_16_batching_over_none": ratio(find("device", "default", 16, "ok_qps"),
                                                 find("nobatch", "default", 16, "ok_qps")),
           # the GPU server against what the same machine's CPUs answer with forwards that cost nothing
           "search_64_device_over_zerocost": ratio(find("device", "default", 64, "ok_qps"),
                                                   find("zerocost", "default", 64, "ok_qps"))}
    for n in args_workers(run):
        if n != 1:
            out[f"search_64_workers{n}_over_one"] = ratio(find(f"workers{n}", "default", 64, "ok_qps"),
                                                          find("workers1", "default", 64, "ok_qps"))
    return out


def args_workers(run: Run) -> list[int]:
    return [int(s.removeprefix("workers")) for s in run.data["servers"] if s.startswith("workers")]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (cpu: a smoke run of the script)")
    parser.add_argument("--quick", action="store_true", help="short cells and fewer clients: a smoke run")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--corpus", type=Path, default=SCIFACT / "corpus.jsonl")
    parser.add_argument("--queries", type=Path, default=SCIFACT / "queries.jsonl")
    parser.add_argument("--ndocs", type=int, default=10**9, help="documents of --corpus taken")
    parser.add_argument("--reps", type=int, default=9, help="copies of them (SciFact x 9: 46,647, all flat segments)")
    parser.add_argument("--index", type=Path, help="an index to serve (default: the one `build` makes in --work)")
    parser.add_argument("--models", type=Path, help="be/, ce/, cmc-fusion/, cmc/ (gpu_run.sh's); default: the shipped")
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts of the `workers` section")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sieve-gpu"))
    parser.add_argument("--port", type=int, default=8810)
    parser.add_argument("--client-procs", type=int, help="processes the clients of a cell are spread over "
                        "(default: ceil(clients / 8), at most half the CPUs; 0 or 1: this process)")
    parser.add_argument("--zerocost-workers", type=int, help="workers of the zerocost section's server "
                        "(default: half the CPUs)")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw", help="raw: a minimal HTTP/1.1 client "
                        "per connection (RawClient); httpx: httpx.AsyncClient, the client of the thirty-fifth "
                        "session's run")
    parser.add_argument("--no-ce-tokens", action="store_true", help="build: leave out the cross-encoder's token ids "
                        "(by default added after the timed build, so /search with the CE tokenizes only its query)")
    parser.add_argument("--spy", type=float, default=0.0, help="seconds of py-spy (on PATH) over the server and its "
                        "workers at the start of the measured window of each cell --spy-cells names (0: none)")
    parser.add_argument("--spy-cells", default="device/default@64,device/default-ce16@64",
                        help="server/cell@clients, comma-separated")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    args.measure_s, args.warm_s = (1.0, 0.3) if args.quick else (10.0, 2.0)
    args.work.mkdir(parents=True, exist_ok=True)
    args.index = args.index or args.work / "idx"
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    sections = args.sections.split(",")
    meta = machine(args.device)
    name = (meta["gpu"] or args.device).lower()
    slug = "cpu_smoke" if args.device == "cpu" else re.sub(r"[^a-z0-9]+", "_", name).strip("_")
    run = Run(args.out or REPO / "benchmarks" / "results" / f"gpu_{slug}.json",
              {"what": "CPU smoke run of benchmarks/gpu.py: NOT a GPU measurement" if args.device == "cpu" else
               "benchmarks/gpu.py on a CUDA machine", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
               "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": meta})
    queries, docs = texts(args.queries, 300), texts(args.corpus, 2000)
    paper = str(args.models / "cmc") if args.models else "shipped:cmc"
    workers = [int(w) for w in args.workers.split(",") if w]
    steps = {  # run in the order --sections names them, so a run cut short has measured what came first
        "build": lambda: build_section(run, args),
        "micro": lambda: micro_section(run, args),
        "serve": lambda: serve_section(run, args, "device", args.device, [
            *[("default", "/search", searches(queries, DEFAULT), c, 1) for c in (1, 16, 64)],
            *[("default-ce16", "/search", searches(queries, DEFAULT_CE), c, 1) for c in (16, 64)],
            *[("rerank-ce-100", "/rerank", reranks(queries, docs, 100), c, 100) for c in (1, 8)],
            ("be-cmc-16384", "/search", searches(queries, BE_CMC_16384), 1, 1)]),
        "papercmc": lambda: serve_section(run, args, "papercmc", args.device, [
            *[("be-cmc-512", "/search", searches(queries, BE_CMC), c, 1) for c in (1, 16)],
            ("be-cmc-16384", "/search", searches(queries, BE_CMC_16384), 1, 1)], {"SIEVE_CMC_PATH": paper}),
        "nobatch": lambda: serve_section(run, args, "nobatch", args.device, [
            ("default", "/search", searches(queries, DEFAULT), 16, 1)], {"SIEVE_BATCHING": "false"}),
        "cpufp32": lambda: serve_section(run, args, "cpufp32", "cpu", [
            ("default", "/search", searches(queries, DEFAULT), c, 1) for c in (16, 64)], {"SIEVE_PRECISION": "fp32"}),
        "cpu": lambda: serve_section(run, args, "cpu", "cpu", [
            *[("default", "/search", searches(queries, DEFAULT), c, 1) for c in (16, 64)],
            ("rerank-ce-100", "/rerank", reranks(queries, docs, 100), 1, 100)]),
        "zerocost": lambda: serve_section(run, args, "zerocost", "cpu", [
            ("default", "/search", searches(queries, DEFAULT), c, 1) for c in (16, 64, 128)],
            workers=args.zerocost_workers or max(1, (os.cpu_count() or 2) // 2), zero_cost=True),
        "workers": lambda: [serve_section(run, args, f"workers{n}", args.device, [
            ("default", "/search", searches(queries, DEFAULT), c, 1) for c in (64, 128)], workers=n) for n in workers],
    }
    for section in sections:
        if section not in steps:
            raise SystemExit(f"unknown section {section!r}: choose from {', '.join(SECTIONS)}")
        steps[section]()
    run.data["ratios"] = ratios(run)
    run.data["finished"], run.data["load_avg_end"] = time.strftime("%Y-%m-%dT%H:%M:%S"), list(os.getloadavg())
    run.save()
    print(json.dumps(run.data["ratios"]), "->", run.out, flush=True)


if __name__ == "__main__":
    main()
