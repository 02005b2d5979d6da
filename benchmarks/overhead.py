"""What a default /search costs the server outside the model forwards, and what worker processes add.

Two sections, each run as interleaved blocks (the order of the sides reversed every round) against servers that
stay up for the whole section:

- `zero_cost`: servers whose model forwards are zero-cost stand-ins (benchmarks/zero_cost.py: installed in the
  benchmark's server processes, not in the product), so what is left is everything else a /search does (HTTP,
  validation, tokenization, batchers, FAISS, BM25, fusion, features, metrics, the response): QPS and server CPU
  milliseconds per request at 1 and 2 worker processes (each with the default SIEVE_PIN_INTERPRETER, automatic:
  a single worker on 2-4 CPUs pins its interpreter; `--unpinned` adds both with it off, and 2 with it on), and
  today's main (`--baseline-tree`) at 1 (`--baseline-2w`: and at 2, `main-2w`).
- `real`: the default /search with the real models at 16 clients, this commit against `--baseline-tree`.
- `replicas` (only when asked for): two single-worker zero-cost servers of this commit on one host, each with half
  the clients at once, unpinned and with SIEVE_PIN_INTERPRETER: whether two servers side by side get in each
  other's way.

Load comes from wrk (Debian's `wrk`, benchmarks/overhead.lua: closed loop, one connection per client, SciFact's
300 test queries in turn, `Cache-Control: no-cache`); its own CPU is read from its rusage. Server CPU is the user +
system time of the server's process tree (supervisor and workers) from /proc over the measured window, divided by
the answered requests. Servers run with SIEVE_LOG_LEVEL=warning (no access log line per request).

    python benchmarks/overhead.py --baseline-tree ../serve-base   # a checkout of main beside this one
    python benchmarks/overhead.py --quick --out /tmp/overhead.json  # short blocks, one round
    python benchmarks/overhead.py --hog 1 --interpreter ...  # a shared host: one more busy process throughout
    python benchmarks/overhead.py --hog 1 --hog-cpu 0 ...  # ... spinning on the CPU a pinned interpreter takes
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
PREBUILT = REPO.parent / "idx" / "scifact"  # `sieve index build` of SciFact, when the machine has one
LUA = Path(__file__).with_name("overhead.lua")
TARGETS = {"zero_cost_server_cpu_ms_median": 1.5, "two_workers_qps_ratio": 1.6, "real_qps_ratio_vs_main": 1.0}


@dataclass
class Side:
    name: str
    tree: Path
    workers: int | None  # None: the tree's default (SIEVE_WORKERS unset)
    zero_cost: bool
    env: dict = field(default_factory=dict)  # settings of this side only (SIEVE_PIN_WORKERS)
    proc: subprocess.Popen | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def tree_state(tree: Path) -> tuple[str, list[str]]:
    """The checkout's HEAD commit and the tracked files it has changed since (a run of an uncommitted tree measures
    more than its commit)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout

    return git("rev-parse", "HEAD").strip(), [line[3:] for line in git("status", "--porcelain",
                                                                         "--untracked-files=no").splitlines()]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(side: Side, index: Path, log: Path, timeout_s: float = 900) -> None:
    side.port = free_port()
    env = {**os.environ, "SIEVE_INDEX_DIR": str(index), "SIEVE_PORT": str(side.port), "SIEVE_HOST": "127.0.0.1",
           "SIEVE_LOG_LEVEL": "warning", "PYTHONPATH": str(side.tree)}
    env.pop("SIEVE_WORKERS", None)
    env.update(side.env)
    if side.zero_cost:
        cmd = [sys.executable, str(REPO / "benchmarks" / "zero_cost.py"), "--workers", str(side.workers or 1)]
    else:
        cmd = [sys.executable, "-m", "sieve.cli", "serve"]
        if side.workers:
            env["SIEVE_WORKERS"] = str(side.workers)
    side.proc = subprocess.Popen(cmd, cwd=side.tree, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                 start_new_session=True)
    wait_ready(side.proc, side.url, log, timeout_s, side.name)


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float, name: str = "server") -> None:
    """Until `url`/readyz answers 200; the log's tail in the error when the process exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} not ready in {timeout_s} s")


def stop(side: Side) -> None:
    if side.proc is not None and side.proc.poll() is None:
        side.proc.terminate()
        try:
            side.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(side.proc.pid, 9)


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of `root` and every process below it (all threads), from /proc."""
    return sum(tree_cpu_by_child(root).values())


def tree_cpu_by_child(root: int) -> dict[int, float]:
    """CPU seconds (user + system, all threads, from /proc) of `root` itself (key root) and of each of its children
    with everything below it (key: the child's pid): with several workers, what each worker spent."""
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(entry)], cpu[int(entry)] = int(fields[1]), int(fields[11]) + int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    out = {root: cpu.get(root, 0) / tick}
    for child in [p for p, pp in parent.items() if pp == root]:
        tree, grew = {child}, True
        while grew:
            more = {p for p, pp in parent.items() if pp in tree} - tree
            tree |= more
            grew = bool(more)
        out[child] = sum(cpu.get(p, 0) for p in tree) / tick
    return out


def wrk(url: str, clients: int, duration_s: float, bodies: Path) -> dict:
    """One wrk run; its result line plus its own CPU seconds (rusage of the child)."""
    proc = subprocess.Popen(["wrk", "-t1", f"-c{clients}", f"-d{duration_s:g}s", "--timeout", "30s", "-s", str(LUA),
                             url], env={**os.environ, "QUERIES_FILE": str(bodies)}, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    line = next((x for x in out.splitlines() if x.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result:\n{out[-2000:]}")
    return {**json.loads(line[len("WRKJSON "):]), "wrk_cpu_s": usage.ru_utime + usage.ru_stime}


def host_busy_s() -> float:
    """CPU seconds the whole host has spent busy since boot (/proc/stat: user, nice, system, irq, softirq; not idle,
    iowait or steal), every process and the kernel's network work included."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def drained(url: str, timeout_s: float = 30.0) -> None:
    """Until the server has no request in progress (its summed `sieve_inflight_requests`): wrk stops with requests
    in flight, which still count against SIEVE_MAX_INFLIGHT when the next run's arrive; at 64 connections that made
    8-35 answers per block 429 (overhead_zen3_s35_c64.json), none with a pause between the runs."""
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("sieve_inflight_requests "):
                if float(line.split()[1]) == 0:
                    return
                break
        else:
            return  # no such gauge (an older tree): nothing to wait for
        time.sleep(0.05)


def block(side: Side, clients: int, duration_s: float, warmup_s: float, bodies: Path) -> dict:
    wrk(side.url, clients, warmup_s, bodies)
    drained(side.url)
    load, cpu0, host0 = os.getloadavg()[0], tree_cpu_by_child(side.proc.pid), host_busy_s()
    got = wrk(side.url, clients, duration_s, bodies)
    cpu1, host1 = tree_cpu_by_child(side.proc.pid), host_busy_s()
    spent = {pid: cpu1[pid] - cpu0.get(pid, 0.0) for pid in cpu1}
    row = {"side": side.name, "workers": side.workers, "zero_cost": side.zero_cost, "clients": clients,
           **measured([got], sum(spent.values()), load)}
    # the whole host's busy CPU over the window (server, wrk, the kernel's loopback TCP, anything else running)
    row["host_cores_busy"] = round((host1 - host0) / row["duration_s"], 2)
    row["host_cpu_ms_per_request"] = round(1000 * (host1 - host0) / max(got["requests"] - got["non_2xx"], 1), 3)
    below = [v for pid, v in spent.items() if pid != side.proc.pid]
    if len(below) > 1:  # workers under a supervisor (asked for, or the automatic count): how evenly the load spread
        seconds = row["duration_s"]
        row["cores_by_process"] = sorted((round(v / seconds, 2) for v in below), reverse=True)
    return row


def measured(runs: list[dict], cpu: float, load: float) -> dict:
    """A block's figures from the wrk runs that loaded it at the same time (one per server) and the CPU seconds of
    those servers over the window: QPS summed, latency percentiles the worst run's."""
    ok = [g["requests"] - g["non_2xx"] for g in runs]
    seconds = max(g["duration_us"] for g in runs) / 1e6
    qps_each = [round(n / (g["duration_us"] / 1e6), 1) for n, g in zip(ok, runs)]
    requests = sum(g["requests"] for g in runs)
    return {"qps": round(sum(qps_each), 1), **({"qps_each": qps_each} if len(runs) > 1 else {}),
            "requests": requests, "errors": sum(g["requests"] - n + g["connect_errors"] + g["read_errors"]
                                                + g["write_errors"] + g["timeouts"] for n, g in zip(ok, runs)),
            "p50_ms": max(g["p50_us"] for g in runs) / 1000, "p99_ms": max(g["p99_us"] for g in runs) / 1000,
            "server_cpu_ms_per_request": round(1000 * cpu / max(sum(ok), 1), 3),
            "server_cores_used": round(cpu / seconds, 2),
            "wrk_cpu_ms_per_request": round(1000 * sum(g["wrk_cpu_s"] for g in runs) / max(requests, 1), 3),
            "duration_s": round(seconds, 2), "load_avg_1m_start": round(load, 2)}


@contextlib.contextmanager
def hogs(count: int, cpu: int | None = None):
    """`count` processes that each spin one thread through every section: the other tenants of a shared host, free
    to run on any CPU (the scheduler places them, as it would another service's threads), or all on `cpu`."""
    bind = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=bind) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def section(sides: list[Side], index: Path, args, bodies: Path, logs: Path, clients: int) -> list[dict]:
    rows = []
    try:
        if not args.fresh:
            for side in sides:
                start(side, index, logs / f"{side.name}.log")
            time.sleep(args.settle)  # the start-ups of the later servers are over: pinned interpreters' watches settle
        for r in range(args.rounds):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                if args.fresh:  # this side's server alone on the host: no idle server's watch or CPU claim around
                    start(side, index, logs / f"{side.name}-{r}.log")
                    time.sleep(args.settle)
                row = {"round": r, **block(side, clients, args.duration, args.warmup, bodies)}
                if args.fresh:
                    stop(side)
                rows.append(row)
                print(f"{row['side']:>16} c={clients} round {r}: {row['qps']:7.1f} QPS, p50 {row['p50_ms']:.1f} ms, "
                      f"server CPU {row['server_cpu_ms_per_request']:.3f} ms/request, errors {row['errors']}, "
                      f"load {row['load_avg_1m_start']}, cores {cores(row)}", file=sys.stderr)
    finally:
        for side in sides:
            stop(side)
    return rows


def replica_section(index: Path, args, bodies: Path, logs: Path, clients: int) -> list[dict]:
    """Two single-worker zero-cost servers of this tree side by side on one host (two replicas, or two services),
    each driven by its own wrk with half the clients at the same time; unpinned, and with SIEVE_PIN_INTERPRETER
    (where the two must not put their interpreters on one core: pinning.claim_cpu)."""
    kinds = {"2x1w": {"SIEVE_PIN_INTERPRETER": "false"}, "2x1w-interp": {"SIEVE_PIN_INTERPRETER": "true"}}
    pairs = {name: [Side(f"{name}-{i}", REPO, 1, True, env) for i in range(2)] for name, env in kinds.items()}
    rows = []
    try:
        for pair in pairs.values():
            for side in pair:
                start(side, index, logs / f"{side.name}.log")
        time.sleep(args.settle)
        for r in range(args.rounds):
            for name in (list(pairs) if r % 2 == 0 else list(pairs)[::-1]):
                row = {"round": r, **pair_block(name, pairs[name], clients, args.duration, args.warmup, bodies)}
                rows.append(row)
                print(f"{name:>16} c={clients} round {r}: {row['qps']:7.1f} QPS ({row['qps_each']}), server CPU "
                      f"{row['server_cpu_ms_per_request']:.3f} ms/request, errors {row['errors']}", file=sys.stderr)
    finally:
        for pair in pairs.values():
            for side in pair:
                stop(side)
    return rows


def pair_block(name: str, pair: list[Side], clients: int, duration_s: float, warmup_s: float, bodies: Path) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    half = max(1, clients // len(pair))
    with ThreadPoolExecutor(len(pair)) as pool:
        list(pool.map(lambda side: wrk(side.url, half, warmup_s, bodies), pair))
        for side in pair:
            drained(side.url)
        load, cpu0 = os.getloadavg()[0], sum(tree_cpu_s(side.proc.pid) for side in pair)
        got = list(pool.map(lambda side: wrk(side.url, half, duration_s, bodies), pair))
    cpu = sum(tree_cpu_s(side.proc.pid) for side in pair) - cpu0
    return {"side": name, "workers": 1, "zero_cost": True, "clients": clients, **measured(got, cpu, load)}


def summary(rows: list[dict]) -> dict:
    out = {}
    for name in dict.fromkeys(r["side"] for r in rows):
        mine = [r for r in rows if r["side"] == name]
        out[name] = {"qps_pooled": round(sum(r["qps"] * r["duration_s"] for r in mine)
                                         / sum(r["duration_s"] for r in mine), 1),
                     "server_cpu_ms_median": statistics.median(r["server_cpu_ms_per_request"] for r in mine),
                     "wrk_cpu_ms_median": statistics.median(r["wrk_cpu_ms_per_request"] for r in mine),
                     **({"host_cpu_ms_median": statistics.median(r["host_cpu_ms_per_request"] for r in mine),
                         "host_cores_busy_median": statistics.median(r["host_cores_busy"] for r in mine)}
                        if all("host_cores_busy" in r for r in mine) else {}),
                     "errors": sum(r["errors"] for r in mine), "blocks": len(mine)}
    return out


def cores(row: dict) -> str:
    """Cores the server used; with several processes, each one's in brackets (supervisor left out)."""
    each = row.get("cores_by_process")
    return f"{row['server_cores_used']}" + (f" ({' / '.join(map(str, each))})" if each else "")


def table(rows: list[dict]) -> str:
    lines = ["| section | side | workers | round | QPS | p50 ms | p99 ms | server CPU ms/req | server cores | "
             "wrk CPU ms/req | host CPU ms/req | host cores busy | errors | load 1m |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {'zero-cost' if r['zero_cost'] else 'real'} | {r['side']} | {r['workers'] or 'default'} | "
              f"{r['round']} | {r['qps']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['server_cpu_ms_per_request']} "
              f"| {cores(r)} | {r['wrk_cpu_ms_per_request']} | {r.get('host_cpu_ms_per_request', '-')} | "
              f"{r.get('host_cores_busy', '-')} | {r['errors']} | {r['load_avg_1m_start']} |"
              for r in rows]
    return "\n".join(lines)


def by_round(rows: list[dict], side_key: str, sides: tuple[str, ...], columns: tuple[str, ...], labels: str) -> dict:
    """Per client count and side, each column's values by round, printed as a markdown table with `labels` (the
    columns' headings, '|'-separated); {"<side>@<clients>": {column: [values by round]}} (client_cost.py,
    rerank_layout.py)."""
    print(f"\n| clients | {side_key} | {labels} |\n|---:|---|{'---|' * len(columns)}")
    out = {}
    for clients in sorted({row["clients"] for row in rows}):
        for side in sides:
            mine = [row for row in rows if row["clients"] == clients and row[side_key] == side]
            out[f"{side}@{clients}"] = {k: [row[k] for row in mine] for k in columns}
            print(f"| {clients} | {side} | " + " | ".join(", ".join(str(row[k]) for row in mine) for k in columns) + " |")
    return out


def query_bodies(path: Path) -> int:
    from sieve.index import read_qrels, read_queries

    qrels = read_qrels(SCIFACT / "qrels" / "test.tsv")
    texts = [text for qid, text in read_queries(SCIFACT / "queries.jsonl").items() if qid in qrels]
    path.write_text("".join(json.dumps({"query": t, "top_k": 10}) + "\n" for t in texts))
    return len(texts)


def index_dir(args, tmp: Path) -> Path:
    if args.index is not None:
        return args.index
    if (PREBUILT / "CURRENT").is_file():
        return PREBUILT
    from benchmarks.load import build_index

    build_index(tmp / "index", "scifact")
    return tmp / "index"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, help=f"a SciFact index (default {PREBUILT} if built, else built here)")
    parser.add_argument("--baseline-tree", type=Path, help="a checkout of main (its own code and index format)")
    parser.add_argument("--baseline-2w", action="store_true", help="zero_cost: main at 2 workers too (`main-2w`)")
    parser.add_argument("--sections", default="zero_cost,real", help="zero_cost, real, replicas "
                        "(two single-worker zero-cost servers side by side), comma-separated")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--real-workers", default="default", help="worker counts of this commit's real-model side, "
                                                                  "comma-separated ('default' = SIEVE_WORKERS unset; "
                                                                  "'2p' = 2 workers with SIEVE_PIN_WORKERS, '1p' one, "
                                                                  "'1i' one with SIEVE_PIN_INTERPRETER, "
                                                                  "'1u' one with it false)")
    parser.add_argument("--pinned", action="store_true", help="zero_cost: also 1 and 2 workers with SIEVE_PIN_WORKERS")
    parser.add_argument("--interpreter", action="store_true", help="zero_cost: also 1 worker with SIEVE_PIN_INTERPRETER")
    parser.add_argument("--hog", type=int, default=0, help="busy processes (one spinning thread each, unpinned, "
                        "nice 0) running through every section: another tenant of a shared host")
    parser.add_argument("--hog-cpu", type=int, help="bind the busy processes to this CPU (the first CPU is where a "
                        "single server pins its interpreter)")
    parser.add_argument("--no-watch", action="store_true", help="zero_cost: also 1 worker pinned as the default "
                        "pins it, but without the watch that moves it off a busy CPU (with --hog-cpu 0)")
    parser.add_argument("--faiss-flat", action="store_true", help="zero_cost: also 1 and 2 workers with "
                        "SIEVE_FLAT_SEARCH_ON_DEVICE=false (FAISS's exact search on a CPU that would use torch's)")
    parser.add_argument("--unpinned", action="store_true", help="zero_cost: also 1 and 2 workers with "
                        "SIEVE_PIN_INTERPRETER=false (the default before it was automatic), and 2 with it true")
    parser.add_argument("--shared-socket", action="store_true", help="zero_cost: also 2 workers on one shared "
                        "listening socket (SIEVE_REUSE_PORT=false), unpinned and with SIEVE_PIN_INTERPRETER (and 2 "
                        "with it on their own sockets, as --unpinned adds)")
    parser.add_argument("--fresh", action="store_true", help="start each side's server for its block and stop it "
                        "after, so one server at a time is up (idle servers' watches react to the others' load and "
                        "hold CPU claims); --settle then waits after each start")
    parser.add_argument("--variant", action="append", default=[], type=variant, metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                        help="zero_cost: also 1 worker of this tree with these environment settings, as side "
                        "this-1w-NAME (repeatable): an A/B of a setting in one interleaved run")
    parser.add_argument("--variant-2w", action="store_true", help="zero_cost: each --variant at 2 workers too, as "
                        "side this-2w-NAME")
    parser.add_argument("--sides", help="only these sides, by name (this-1w,main,this-2w,...): fewer servers on the host")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per block")
    parser.add_argument("--log-level", default="warning", help="SIEVE_LOG_LEVEL of every server of the zero_cost "
                        "and real sections (warning: no access line; info, the shipped default: one per request)")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each block")
    parser.add_argument("--rounds", type=int, default=4, help="blocks per side per section")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds between the last server's start and the "
                        "first block: a pinned interpreter that the other servers' start-ups made its watch unpin is "
                        "pinned again 5 s later (service/core_watch.py)")
    parser.add_argument("--quick", action="store_true", help="5 s blocks, 1 round")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "overhead.json")
    parser.add_argument("--logs", type=Path, help="keep the servers' logs in this folder (default: deleted)")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.rounds = 5.0, 1.0, 1
    return args


def variant(text: str) -> tuple[str, dict[str, str]]:
    """--variant NAME:KEY=VALUE[,KEY=VALUE] -> (NAME, {KEY: VALUE})."""
    name, _, settings = text.partition(":")
    pairs = [kv.partition("=") for kv in settings.split(",")]
    if not name or not settings or any(not key or not sep for key, sep, _ in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME:KEY=VALUE[,KEY=VALUE]")
    return name, {key: value for key, _, value in pairs}


def sides_of(section_name: str, args) -> list[Side]:
    base = [Side("main", args.baseline_tree.resolve(), 1 if section_name == "zero_cost" else None,
                 section_name == "zero_cost")] if args.baseline_tree else []
    if args.baseline_tree and section_name == "zero_cost" and args.baseline_2w:
        base.append(Side("main-2w", args.baseline_tree.resolve(), 2, True))
    pin, interp = {"SIEVE_PIN_WORKERS": "true"}, {"SIEVE_PIN_INTERPRETER": "true"}
    if section_name == "zero_cost":
        pinned = [Side("this-1w-pinned", REPO, 1, True, pin), Side("this-2w-pinned", REPO, 2, True, pin)] \
            if args.pinned else []
        interpreter = [Side("this-1w-interp", REPO, 1, True, interp)] if args.interpreter else []
        off = {"SIEVE_PIN_INTERPRETER": "false"}
        unpinned = [Side("this-1w-unpinned", REPO, 1, True, off), Side("this-2w-unpinned", REPO, 2, True, off),
                    Side("this-2w-interp", REPO, 2, True, interp)] if args.unpinned else []
        watchless = [Side("this-1w-nowatch", REPO, 1, True, {"SIEVE_BENCH_NO_WATCH": "1"})] if args.no_watch else []
        faiss = {"SIEVE_FLAT_SEARCH_ON_DEVICE": "false"}
        faiss_flat = [Side("this-1w-faiss", REPO, 1, True, faiss), Side("this-2w-faiss", REPO, 2, True, faiss)] \
            if args.faiss_flat else []
        shared = {"SIEVE_REUSE_PORT": "false"}
        one_socket = [Side("this-2w-shared", REPO, 2, True, shared),
                      *([] if args.unpinned else [Side("this-2w-interp", REPO, 2, True, interp)]),
                      Side("this-2w-interp-shared", REPO, 2, True, {**interp, **shared})] if args.shared_socket else []
        variants = [Side(f"this-{n}w-{name}", REPO, n, True, settings) for name, settings in args.variant
                    for n in ((1, 2) if args.variant_2w else (1,))]
        return [Side("this-1w", REPO, 1, True), *base, Side("this-2w", REPO, 2, True), *pinned, *interpreter,
                *unpinned, *watchless, *faiss_flat, *one_socket, *variants]
    sides = []
    for count in args.real_workers.split(","):
        if count == "default":
            sides.append(Side("this-defaultw", REPO, None, False))
        else:
            suffix, env = {"p": ("-pinned", pin), "i": ("-interp", interp),
                           "u": ("-unpinned", {"SIEVE_PIN_INTERPRETER": "false"})}.get(count[-1], ("", {}))
            n = int(count.rstrip("piu"))
            sides.append(Side(f"this-{n}w{suffix}", REPO, n, False, env))
    return [*sides, *base]


def main(argv=None) -> None:
    args = parse_args(argv)
    from benchmarks.cmc_latency import machine

    info = machine()
    result = {"machine": info, "targets": TARGETS, "clients": args.clients, "baseline_tree": str(args.baseline_tree),
              "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds, "sections": {},
              "request": {"body": {"query": "<SciFact test query>", "top_k": 10},
                          "headers": {"Cache-Control": "no-cache"}},
              "command": shlex.join(["python", "benchmarks/overhead.py", *(sys.argv[1:] if argv is None else argv)]),
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if args.baseline_tree:
        result["baseline_commit"], result["baseline_uncommitted"] = tree_state(Path(args.baseline_tree))
    result["commit"], result["uncommitted"] = tree_state(REPO)
    result["hog"], result["hog_cpu"] = args.hog, args.hog_cpu
    result["log_level"] = args.log_level  # every server's but a --variant's own
    with tempfile.TemporaryDirectory(prefix="sieve-overhead-") as tmp, hogs(args.hog, args.hog_cpu):
        tmp = Path(tmp)
        bodies = tmp / "bodies.jsonl"
        logs = args.logs or tmp
        logs.mkdir(parents=True, exist_ok=True)
        result["queries"] = query_bodies(bodies)
        index = index_dir(args, tmp)
        result["index"] = str(index)
        for name in args.sections.split(","):
            if name == "replicas":
                rows = replica_section(index, args, bodies, logs, args.clients)
            else:
                sides = [s for s in sides_of(name, args) if not args.sides or s.name in args.sides.split(",")]
                for side in sides:  # a variant's own level stays its own
                    side.env = {"SIEVE_LOG_LEVEL": args.log_level, **side.env}
                rows = section(sides, index, args, bodies, logs, args.clients)
            result["sections"][name] = {"rows": rows, "summary": summary(rows)}
            print(table(rows))
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["verdict"] = verdict(result["sections"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["verdict"], indent=2))


def paired_ratios(rows: list[dict], side: str, base: str) -> list[float]:
    """`side`'s server CPU per request over `base`'s, round by round: the two blocks of a round ran back to back, so
    a host that slows through the hour moves both (the comparison to report on a shared machine)."""
    cpu = {(r["round"], r["side"]): r["server_cpu_ms_per_request"] for r in rows}
    return [round(cpu[(n, side)] / cpu[(n, base)], 3) for n in sorted({r["round"] for r in rows})
            if (n, side) in cpu and (n, base) in cpu and cpu[(n, base)]]


def verdict(sections: dict) -> dict:
    out = {}
    zero = sections.get("zero_cost", {}).get("summary", {})
    if "this-1w" in zero:
        out["zero_cost_server_cpu_ms_median"] = {side: s["server_cpu_ms_median"] for side, s in zero.items()}
    rows = sections.get("zero_cost", {}).get("rows", [])
    if "this-1w" in zero and "main" in zero:
        ratios = paired_ratios(rows, "this-1w", "main")
        out["zero_cost_cpu_ratio_vs_main_by_round"] = ratios
        out["zero_cost_cpu_ratio_vs_main_median"] = round(statistics.median(ratios), 3) if ratios else None
    if "this-1w" in zero and "this-2w" in zero:
        out["two_workers_qps_ratio"] = round(zero["this-2w"]["qps_pooled"] / zero["this-1w"]["qps_pooled"], 2)
    for one, two in (("this-1w-unpinned", "this-2w-unpinned"), ("this-1w", "this-2w-interp"),
                     ("this-1w-unpinned", "this-1w"), ("this-2w-shared", "this-2w"),
                     ("this-2w-interp-shared", "this-2w-interp"), ("main", "main-2w"), ("main-2w", "this-2w")):
        if one in zero and two in zero:
            out[f"qps_ratio {two} / {one}"] = round(zero[two]["qps_pooled"] / zero[one]["qps_pooled"], 2)
    if "this-1w" in zero and "this-2w-pinned" in zero:
        out["two_pinned_workers_qps_ratio"] = round(zero["this-2w-pinned"]["qps_pooled"]
                                                    / zero["this-1w"]["qps_pooled"], 2)
    real = sections.get("real", {}).get("summary", {})
    if "main" in real:
        out["real_qps_ratio_vs_main"] = {side: round(s["qps_pooled"] / real["main"]["qps_pooled"], 2)
                                         for side, s in real.items() if side != "main"}
    pair = sections.get("replicas", {}).get("summary", {})
    if "2x1w" in pair and "2x1w-interp" in pair:
        out["replicas_interp_qps_ratio"] = round(pair["2x1w-interp"]["qps_pooled"] / pair["2x1w"]["qps_pooled"], 2)
    return out


if __name__ == "__main__":
    main()
