"""Sieve's /rerank cross-encoder against infinity (`infinity-emb`, torch engine) on the same plain Hugging Face
cross-encoder checkpoint, side by side on this machine, A/B blocks interleaved.

The checkpoint: the packaged MiniLM bi-encoder body with a seeded one-logit head (AutoModelForSequenceClassification,
num_labels=1, as tests/service/conftest.py builds it), tokenizer cut at 256 tokens, so both sides read the same
256-token pairs (documents are runs of demo-corpus texts, longer than 256 tokens). Infinity runs in its own
virtual environment (torch==2.13.0 installed first, then infinity-emb[server,torch]); it is created when missing.

Each cell (clients x documents per request) runs `--rounds` rounds of one block per side, sides alternating (ABBA),
each block one warm-up request per client and then `--per-client` closed-loop requests per client; ratios are
Sieve / infinity over the pooled blocks (documents per second of wall time, latency percentiles, server CPU
seconds per pair). Infinity runs once per `--infinity-dtypes` value (float32: what its `--dtype auto` picks on a
CPU; bfloat16: what it runs when told, native on AVX-512 BF16 / AMX CPUs); each row's ratios are against the fastest
of them in that cell (infinity at its best setting) and `vs` holds every one. Each row also gives the pair
throughput as a fraction of this machine's matmul peak (fp32 and bf16 2048^2 matmuls timed in the same run), the
ceiling both sides share. `--baseline-ref REF` adds Sieve at git commit REF (exported with `git archive`, nothing checked out) as a
third side: the before/after of a change to Sieve, measured in the same interleaved run; `--sieve-torch` adds Sieve with
SIEVE_CE_RUNTIME=torch (its cross-encoder in torch rather than OpenVINO) the same way.

    python benchmarks/peers.py                                   # 1 and 4 clients, 32 and 100 docs (~15 min)
    python benchmarks/peers.py --quick --out /tmp/peers.json     # smoke run
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.cmc_latency import machine  # noqa: E402
from benchmarks.load import cpu_seconds, export_ref, percentile  # noqa: E402
from tests.server import free_port  # noqa: E402

SEED = 0
PAIR_TOKENS = 256
INFINITY = "infinity-emb[server,torch]==0.0.78"
VENV = Path(os.environ.get("SIEVE_BENCH_INFINITY_VENV", Path.home() / ".cache" / "sieve-bench" / "infinity-venv"))
QUERIES = ["how do stars turn into red giants", "what makes bread rise", "causes of volcanic eruptions",
           "how are exoplanets found", "why do leaves change colour", "how do vaccines train immunity"]
SIEVE_SETTINGS = {"SIEVE_BATCHING": "true", "SIEVE_CE_BATCH_TOKENS": "8192", "SIEVE_CE_MAX_LENGTH": str(PAIR_TOKENS),
                  "SIEVE_CE_QUERY_MAX_LENGTH": "64", "SIEVE_PRECISION": "auto", "SIEVE_CACHE_ENABLED": "false",
                  "SIEVE_CMC_PATH": "untrained", "SIEVE_RERANK_MAX_DOCUMENTS": "1000"}
INFINITY_ARGS = ["--engine", "torch", "--device", "cpu", "--batch-size", "32", "--no-bettertransformer", "--no-compile",
                 "--no-model-warmup"]
NO_CACHE = {"Cache-Control": "no-cache"}  # Sieve's result cache is off too (SIEVE_CACHE_ENABLED=false)
INFINITY_DTYPES = ("float32", "bfloat16")  # infinity's --dtype auto is float32 on a CPU; bfloat16 it runs when told


# -- the checkpoint, the documents, the environments -----------------------------------------------------------
def plain_cross_encoder(out: Path) -> Path:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from sieve.models.weights import default_model_path

    torch.manual_seed(SEED)
    AutoModelForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=1).save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    tokenizer.model_max_length = PAIR_TOKENS  # infinity truncates pairs at the tokenizer's length
    tokenizer.save_pretrained(out)
    return out


def long_documents(n: int = 100) -> list[str]:
    """n texts of 5 consecutive demo documents each (> 256 tokens): every pair is cut to 256 tokens."""
    from sieve.cli import DEMO_CORPUS

    docs = [json.loads(line)["text"] for line in DEMO_CORPUS.read_text().splitlines() if line.strip()]
    return [" ".join(docs[(i + j) % len(docs)] for j in range(5)) for i in range(n)]


def infinity_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)  # the local wheel first
        subprocess.run([str(python), "-m", "pip", "install", "-q", INFINITY], check=True)
    return VENV / "bin" / "infinity_emb"


# -- servers ---------------------------------------------------------------------------------------------------
class Side:
    """One server process: how to start it, where it answers, how a rerank request looks to it."""

    def __init__(self, name: str, cmd: list[str], env: dict, cwd: Path, ready: str, log: Path, kind: str):
        self.name, self.kind = name, kind
        self.port = free_port()
        cmd = [c.replace("{port}", str(self.port)) for c in cmd]
        env = {**os.environ, **{k: v.replace("{port}", str(self.port)) for k, v in env.items()}}
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait(ready, log)

    def wait(self, ready: str, log: Path, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + ready, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready in {timeout_s}s")

    def body(self, query: str, docs: list[str]) -> tuple[str, dict]:
        if self.kind == "infinity":
            return "/rerank", {"model": "ce", "query": query, "documents": docs, "return_documents": False}
        return "/rerank", {"model": "ce", "query": query, "documents": docs}

    def scores(self, response: dict, n: int) -> list[float]:
        out = [0.0] * n
        for r in response["results"]:
            out[r["index"]] = r["relevance_score"]
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def sieve_side(name: str, root: Path, index_dir: Path, ce: Path, log_dir: Path, **settings: str) -> Side:
    env = {"PYTHONPATH": str(root), "SIEVE_HOST": "127.0.0.1", "SIEVE_PORT": "{port}", "SIEVE_INDEX_DIR": str(index_dir),
           "SIEVE_CROSS_ENCODER_PATH": str(ce), **SIEVE_SETTINGS, **settings}
    return Side(name, [sys.executable, "-m", "sieve.cli", "serve"], env, root, "/readyz", log_dir / f"{name}.log", "sieve")


def infinity_side(ce: Path, log_dir: Path, dtype: str) -> Side:
    cmd = [str(infinity_venv()), "v2", "--model-id", str(ce), "--served-model-name", "ce", "--port", "{port}",
           "--host", "127.0.0.1", *INFINITY_ARGS, "--dtype", dtype]
    env = {"HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
    name = f"infinity-{dtype}"
    return Side(name, cmd, env, log_dir, "/health", log_dir / f"{name}.log", "infinity")


# -- load --------------------------------------------------------------------------------------------------------
def block(side: Side, clients: int, docs: list[str], per_client: int) -> dict:
    """Closed-loop clients: one warm-up request each, then (all together) `per_client` requests each. Counted by
    requests, not seconds, so a block holds enough answers however loaded the machine is."""
    latencies, errors, lock = [], [0], threading.Lock()
    ready = threading.Barrier(clients + 1)

    def client(offset: int) -> None:
        with httpx.Client(base_url=side.url, timeout=900, headers=NO_CACHE) as http:
            for n in range(per_client + 1):
                path, body = side.body(QUERIES[(offset + n * clients) % len(QUERIES)], docs)
                t0 = time.perf_counter()
                ok = http.post(path, json=body).status_code == 200
                ms = (time.perf_counter() - t0) * 1000
                with lock:
                    if not ok:
                        errors[0] += 1
                    elif n:
                        latencies.append(ms)
                if n == 0:
                    ready.wait()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    ready.wait()  # every client warmed up: the measured part starts
    cpu0, wall0 = cpu_seconds(side.proc.pid), time.monotonic()
    for t in threads:
        t.join()
    cpu, wall = cpu_seconds(side.proc.pid) - cpu0, time.monotonic() - wall0
    return {"latencies_ms": latencies, "errors": errors[0], "docs": len(latencies) * len(docs), "wall_s": wall, "cpu_s": cpu}


def pooled(blocks: list[dict]) -> dict:
    lat = [ms for b in blocks for ms in b["latencies_ms"]]
    wall, docs, cpu = sum(b["wall_s"] for b in blocks), sum(b["docs"] for b in blocks), sum(b["cpu_s"] for b in blocks)
    return {"requests": len(lat), "errors": sum(b["errors"] for b in blocks), "docs_per_s": docs / wall,
            "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
            "mean_ms": statistics.fmean(lat) if lat else float("nan"), "cpu_per_pair_ms": 1000 * cpu / max(docs, 1)}


def ratios(a: dict, b: dict) -> dict:
    return {"docs_per_s_ratio": a["docs_per_s"] / b["docs_per_s"], "p50_ratio": a["p50_ms"] / b["p50_ms"],
            "p95_ratio": a["p95_ms"] / b["p95_ms"], "mean_latency_ratio": a["mean_ms"] / b["mean_ms"],
            "cpu_per_pair_ratio": a["cpu_per_pair_ms"] / b["cpu_per_pair_ms"]}


def same_order(sides: list[Side], docs: list[str]) -> dict[str, bool]:
    """Per side: whether it ranks one request exactly as infinity in fp32 (the reference) does, and the Spearman
    correlation of its scores with the reference's (a seeded one-logit head gives close scores: bf16 reorders some)."""
    from sieve.models.precision import spearman

    scores = {}
    for side in sides:
        path, body = side.body(QUERIES[0], docs)
        scores[side.name] = side.scores(httpx.post(side.url + path, json=body, timeout=600, headers=NO_CACHE).json(), len(docs))
    reference = scores.get("infinity-float32") or next(s for n, s in scores.items() if n.startswith("infinity"))
    order = lambda s: sorted(range(len(docs)), key=lambda i: -s[i])  # noqa: E731
    return {name: {"same_order": order(s) == order(reference), "spearman": spearman(np.array(s), np.array(reference))}
            for name, s in scores.items()}


def pair_gflop(checkpoint: Path, tokens: int = PAIR_TOKENS) -> float:
    """Matmul GFLOP of one cross-encoder pair of `tokens` tokens (2 per multiply-add; the one-logit head left out)."""
    config = json.loads((checkpoint / "config.json").read_text())
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    per_layer = 2 * tokens * (4 * h * h + 2 * h * i) + 4 * tokens * tokens * h  # qkv+out, FFN; QK^T and AV
    return layers * per_layer / 1e9


def ceiling(checkpoint: Path) -> dict:
    """This machine's matmul peaks and what one pair costs: the throughput neither side can pass."""
    import torch

    from benchmarks.cmc_latency import matmul_gflops

    return {"pair_gflop": pair_gflop(checkpoint), "matmul_gflops_fp32": matmul_gflops()["best"],
            "matmul_gflops_bf16": matmul_gflops(dtype=torch.bfloat16)["best"]}


def peak_fractions(docs_per_s: float, peak: dict) -> dict:
    achieved = docs_per_s * peak["pair_gflop"]
    return {"gflops": achieved, "of_fp32_peak": achieved / peak["matmul_gflops_fp32"],
            "of_bf16_peak": achieved / peak["matmul_gflops_bf16"]}


def run_cells(sides: list[Side], cells: list[tuple[int, int]], args, report, peak: dict) -> list[dict]:
    """Every cell, each written out (`report(rows)`) as soon as it is done."""
    documents, rows = long_documents(max(d for _, d in cells)), []
    for clients, n_docs in cells:
        docs = documents[:n_docs]
        # the baseline measures reply-as-done, which only concurrent requests can show
        here = [s for s in sides if s.name != "sieve-baseline" or clients > 1]
        blocks: dict[str, list] = {s.name: [] for s in here}
        for r in range(args.rounds):
            for side in (here if r % 2 == 0 else here[::-1]):  # ABBA: neither side always runs first
                blocks[side.name].append(block(side, clients, docs, args.per_client))
        stats = {name: pooled(b) for name, b in blocks.items()}
        # the ratios are against infinity at its best setting in this cell (its fastest dtype); every one in vs
        peers = [name for name in stats if name.startswith("infinity")]
        best = max(peers, key=lambda name: stats[name]["docs_per_s"])
        row = {"clients": clients, "docs": n_docs, "infinity_best": best, **ratios(stats["sieve"], stats[best]),
               "vs": {name: ratios(stats["sieve"], stats[name]) for name in peers}, "sides": stats,
               "of_peak": {name: peak_fractions(st["docs_per_s"], peak) for name, st in stats.items()}}
        if "sieve-baseline" in stats:
            row["vs_baseline"] = ratios(stats["sieve"], stats["sieve-baseline"])
        if "sieve-torch" in stats:
            row["vs_sieve_torch"] = ratios(stats["sieve"], stats["sieve-torch"])
        rows.append(row)
        each = ", ".join(f"docs/s vs {n} {v['docs_per_s_ratio']:.2f}" for n, v in row["vs"].items())
        baseline = f", mean vs baseline {row['vs_baseline']['mean_latency_ratio']:.2f}" if "vs_baseline" in row else ""
        baseline += f", docs/s vs sieve-torch {row['vs_sieve_torch']['docs_per_s_ratio']:.2f}" if "vs_sieve_torch" in row else ""
        print(f"  clients {clients} docs {n_docs}: vs {best}: docs/s ratio {row['docs_per_s_ratio']:.2f}, mean latency "
              f"ratio {row['mean_latency_ratio']:.2f}; {each}{baseline}", flush=True)
        report(rows)
    return rows


# -- report --------------------------------------------------------------------------------------------------------
def table(rows: list[dict]) -> str:
    lines = ["| clients | docs | infinity's best | docs/s ratio | p50 ratio | p95 ratio | mean latency ratio | "
             "CPU/pair ratio | sieve docs/s | infinity docs/s (each dtype) | sieve / bf16 matmul peak |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        peers = ", ".join(f"{n.removeprefix('infinity-')} {r['sides'][n]['docs_per_s']:.1f}" for n in r["vs"])
        lines.append(f"| {r['clients']} | {r['docs']} | {r['infinity_best']} | {r['docs_per_s_ratio']:.2f} | "
                     f"{r['p50_ratio']:.2f} | {r['p95_ratio']:.2f} | {r['mean_latency_ratio']:.2f} | "
                     f"{r['cpu_per_pair_ratio']:.2f} | {r['sides']['sieve']['docs_per_s']:.1f} | {peers} | "
                     f"{r['of_peak']['sieve']['of_bf16_peak']:.2f} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round, 2 requests per client, 1 and 4 clients at 32 docs")
    parser.add_argument("--rounds", type=int, default=2, help="blocks per side per cell (sides alternate ABBA)")
    parser.add_argument("--per-client", type=int, default=4, help="measured requests per client per block")
    parser.add_argument("--cells", default="1x32,4x32,1x100,4x100", help="clients x documents per request, in order")
    parser.add_argument("--baseline-ref", help="also serve Sieve at this git commit (the before of a change)")
    parser.add_argument("--infinity-dtypes", default=",".join(INFINITY_DTYPES),
                        help="infinity's --dtype values, one server each; ratios are against the fastest per cell")
    parser.add_argument("--sieve-torch", action="store_true",
                        help="also serve Sieve with SIEVE_CE_RUNTIME=torch (the torch path beside the default runtime)")
    parser.add_argument("--shared", action="store_true", help="record that other work ran on the machine meanwhile")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "peers.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.per_client = 1, 2
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so the servers are stopped on the way out
    info = machine()
    print(f"machine: {info}", flush=True)
    cells = [(1, 32), (4, 32)] if args.quick else [tuple(map(int, c.split("x"))) for c in args.cells.split(",")]
    with tempfile.TemporaryDirectory(prefix="sieve-peers-") as tmp:
        tmp = Path(tmp)
        ce = plain_cross_encoder(tmp / "minilm-ce")
        from benchmarks.load import build_index

        build_index(tmp / "index", "demo")
        sides = [sieve_side("sieve", REPO, tmp / "index", ce, tmp),
                 *(infinity_side(ce, tmp, dtype) for dtype in args.infinity_dtypes.split(","))]
        if args.sieve_torch:
            sides.append(sieve_side("sieve-torch", REPO, tmp / "index", ce, tmp, SIEVE_CE_RUNTIME="torch"))
        if args.baseline_ref:
            sides.append(sieve_side("sieve-baseline", export_ref(args.baseline_ref, tmp / "baseline"), tmp / "index", ce, tmp))
        try:
            precision = httpx.get(sides[0].url + "/readyz").json().get("precision", {})
            orders = same_order(sides, long_documents(32))
            peak = ceiling(ce)
            print(f"ceiling: {peak}", flush=True)
            report = lambda rows: write(args, {**info, "ceiling": peak}, precision, orders, rows)  # noqa: E731
            rows = run_cells(sides, cells, args, report, peak)
        finally:
            for side in sides:
                side.stop()
    print("\n" + table(rows))
    print(f"agreement with infinity (its fp32 side when run) on one request: {orders}\nwrote {args.out}")


def write(args, info: dict, precision: dict, orders: dict, rows: list[dict]) -> None:
    info = {**info, "load_avg_now": list(os.getloadavg())}
    result = {"machine": info, "cpu_flags": info["cpu_flags"], "shared_machine": args.shared,
              "note": ("run while other work shared the 2 cores: absolute numbers are loaded; " if args.shared else "")
              + "the ratios come from interleaved blocks (ABBA) and are what counts",
              "settings": {"sieve": {**SIEVE_SETTINGS, "precision_chosen": precision},
                           "infinity": {"version": INFINITY, "args": INFINITY_ARGS,
                                        "dtypes": args.infinity_dtypes.split(",")},
                           "checkpoint": "packaged all-MiniLM-L6-v2 body + seeded one-logit head (num_labels=1)",
                           "pair_tokens": PAIR_TOKENS, "rounds": args.rounds, "per_client": args.per_client,
                           "baseline_ref": args.baseline_ref, "sieve_torch_side": args.sieve_torch},
              "agreement_with_infinity_fp32": orders, "rows": rows,
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]), "quick": args.quick}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
