"""CMC latency on this machine: how close one CMC forward comes to its FLOP-bound time, and /search latency.

1. fp32 matmul throughput (2048 x 2048) measured in the same run, with torch's default thread count.
2. CMC (CMCConfig defaults, eval mode, gates randomised) scoring one query against K random unit vectors;
   p50 per K against flop_bound_ms = FLOPs / measured GFLOP/s.
3. The per-document precompute issue 17 asks about: in shared mode the first layer's q/k/v projections of a
   candidate depend on its document vector alone, so they could be stored per document. Timed here as its upper
   bound: the served CMC at K=512 against the same forward given those projections (their gather not counted).
4. /search through a real server over a SciFact index, one client, bi-encoder only and bi-encoder + the two-layer CMC
   (shipped:cmc) over 512 candidates.

    python benchmarks/cmc_latency.py            # full run (~5 min with a warm embedding cache)
    python benchmarks/cmc_latency.py --quick    # smoke run (~1 min with a warm cache)
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sieve.models.cmc import CMC, CMCConfig, randomize_gates  # noqa: E402

SEED = 0
KS = (16, 64, 128, 512, 1024, 2048, 4096, 16384)
QUICK_KS = (16, 64, 512, 2048)
TARGET = "CMC at K=512 faster than its fp32 FLOP-bound time (ratio < 1.0) in the precision served, Spearman >= 0.99"
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
CACHE_DIR = Path(os.environ.get("SIEVE_TEST_CACHE", Path.home() / ".cache" / "sieve-tests"))
SEARCH_MODES = {
    "be": {"retriever": "be", "rerank": "none", "retrieve_k": 512, "top_k": 10},
    "be+cmc": {"retriever": "be", "rerank": "cmc", "retrieve_k": 512, "top_k": 10},
}


# -- timing helpers -----------------------------------------------------------------------------------------
def time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank-interpolated percentile (q in [0, 100])."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# -- 1. matmul throughput -----------------------------------------------------------------------------------
def matmul_gflops(n: int = 2048, warmup: int = 2, runs: int = 10, dtype: torch.dtype = torch.float32) -> dict:
    """Best and median GFLOP/s of an n x n matmul in `dtype`; the best fp32 one is the bound CMC is compared against."""
    gen = torch.Generator().manual_seed(SEED)
    a, b = torch.randn(n, n, generator=gen).to(dtype), torch.randn(n, n, generator=gen).to(dtype)
    with torch.inference_mode():
        for _ in range(warmup):
            torch.matmul(a, b)
        times = [time_ms(lambda: torch.matmul(a, b)) for _ in range(runs)]
    flop = 2 * n ** 3
    return {"best": flop / min(times) / 1e6, "median": flop / statistics.median(times) / 1e6, "runs": runs}


# -- 2. CMC forward vs its FLOP bound -----------------------------------------------------------------------
def cmc_flop(cfg: CMCConfig, k: int) -> float:
    """Matmul FLOPs of one forward over L = K + 1 tokens (2 per multiply-add; norms and GELU left out)."""
    L, d = k + 1, cfg.dim
    per_layer = 24 * L * d ** 2 + 4 * L ** 2 * d  # qkv 6Ld^2 + out 2Ld^2 + FFN 16Ld^2; QK^T and AV 2L^2d each
    return cfg.n_layers * per_layer


def benchmark_model() -> CMC:
    torch.manual_seed(SEED)
    model = CMC(CMCConfig(dropout=0.0)).eval()
    return randomize_gates(model, seed=SEED)  # untrained gates are zero: the layers would be skipped in effect


def unit_inputs(k: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + k)
    query = torch.nn.functional.normalize(torch.randn(1, d, generator=gen), dim=-1)  # (1, d)
    cands = torch.nn.functional.normalize(torch.randn(1, k, d, generator=gen), dim=-1)  # (1, K, d)
    return query, cands


def cmc_p50_ms(models: list, k: int, budget_s: float, min_runs: int, max_runs: int) -> tuple[list[float], int]:
    """Two warm-ups each, then as many runs as fit in budget_s (within [min_runs, max_runs]), the models
    alternating run by run (so load from other processes hits them alike); p50 in ms per model."""
    query, cands = unit_inputs(k, models[0].cfg.dim)
    with torch.inference_mode():
        for model in models:
            model(query, cands)  # the first call at a new shape pays allocator and kernel set-up
        estimate = sum(time_ms(lambda: model(query, cands)) for model in models)
        runs = int(min(max_runs, max(min_runs, budget_s * 1000 / estimate)))
        times = [[] for _ in models]
        for _ in range(runs):
            for model, out in zip(models, times):
                out.append(time_ms(lambda: model(query, cands)))
    return [statistics.median(t) for t in times], runs


def lower_precision_model(model: CMC) -> tuple[CMC | None, str]:
    """The CMC the service would serve on this CPU (models/precision.py), or None when that is fp32."""
    from sieve.models.precision import best_dtype, lowered

    dtype, _ = best_dtype(torch.device("cpu"), "auto")
    return (None if dtype == "fp32" else lowered(model, dtype, only="layers")), dtype


def rank_agreement(model: CMC, low: CMC, k: int) -> float:
    """Spearman of the lowered model's scores with fp32's on the benchmark's fixed inputs (the quality guard)."""
    from sieve.models.precision import spearman

    query, cands = unit_inputs(k, model.cfg.dim)
    with torch.inference_mode():
        return spearman(model(query, cands)[0].numpy(), low(query, cands)[0].numpy())


def cmc_rows(ks: tuple[int, ...], gflops: float, budget_s: float, min_runs: int, max_runs: int) -> list[dict]:
    model = benchmark_model()
    low, dtype = lower_precision_model(model)
    rows = []
    for k in ks:
        (ms, *low_ms), runs = cmc_p50_ms([model] + ([low] if low is not None else []), k, budget_s, min_runs, max_runs)
        flop = cmc_flop(model.cfg, k)
        bound_ms = flop / gflops / 1e6
        row = {"k": k, "ms_p50": ms, "flop_bound_ms": bound_ms, "ratio": ms / bound_ms, "gflop": flop / 1e9, "runs": runs}
        if low is not None:  # ratio_lowered: against the fp32 FLOP bound, as the target asks
            row.update(dtype=dtype, ms_p50_lowered=low_ms[0], ratio_lowered=low_ms[0] / bound_ms,
                       speedup_lowered=ms / low_ms[0], spearman_lowered=rank_agreement(model, low, k))
        rows.append(row)
        print(f"  K={k:>6}: p50 {ms:9.2f} ms over {runs} runs, ratio {ms / bound_ms:.2f}"
              + (f"; {dtype} {low_ms[0]:.2f} ms, ratio {low_ms[0] / bound_ms:.2f}, Spearman {row['spearman_lowered']:.4f}"
                 if low is not None else ""), flush=True)
    return rows


def precomputed_first_layer(model: CMC):
    """model's forward (no mask, no evidence) with the first layer's candidate projections passed in: (query,
    candidates, projections (B, K, 3d)) -> scores. Mirrors CMCLayer.forward; only the query row is projected."""
    import torch.nn.functional as F

    first, rest = model.layers[0], model.layers[1:]

    def forward(query, cands, projections):
        x = torch.cat([query.unsqueeze(1), cands], dim=1)  # (B, 1+K, d)
        B, L, d = x.shape
        qkv = torch.cat([first.qkv(x[:, :1]), projections], dim=1)  # (B, 1+K, 3d)
        q, k, v = qkv.view(B, L, 3, first.n_heads, d // first.n_heads).permute(2, 0, 3, 1, 4)
        a = first.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, d))
        h = first.norm_attn(x + a)
        h = first.norm_ff(h + first.ff_out(F.gelu(first.ff_in(h))))
        x = x + first.gate * h
        for layer in rest:
            x = layer(x)
        return torch.einsum("bd,bkd->bk", x[:, 0], x[:, 1:])

    return forward


def precompute_bound(k: int = 512, runs: int = 100) -> dict:
    """The served CMC at K against the same weights given the first layer's candidate projections, alternating."""
    from sieve.models.attention import LowPrecisionAttention
    from sieve.models.precision import DTYPES, best_dtype

    name, _ = best_dtype(torch.device("cpu"), "auto")
    dtype = DTYPES.get(name, torch.float32)  # int8 hosts: timed in fp32 (the projections would be stored as floats)
    model = benchmark_model().to(dtype)
    query, cands = (t.to(dtype) for t in unit_inputs(k, model.cfg.dim))
    fast = precomputed_first_layer(model)
    with torch.inference_mode(), LowPrecisionAttention():
        projections = model.layers[0].qkv(cands)
        error = (fast(query, cands, projections).float() - model(query, cands).float()).abs().max().item()
        full, pre = [], []
        for _ in range(3):
            model(query, cands), fast(query, cands, projections)
        for _ in range(runs):
            full.append(time_ms(lambda: model(query, cands)))
            pre.append(time_ms(lambda: fast(query, cands, projections)))
    row = {"k": k, "dtype": str(dtype).removeprefix("torch."), "ms_p50": statistics.median(full),
           "ms_p50_precomputed": statistics.median(pre), "runs": runs, "max_abs_score_diff": error,
           "bytes_per_document": 3 * model.cfg.dim * torch.finfo(dtype).bits // 8}
    row["speedup"] = row["ms_p50"] / row["ms_p50_precomputed"]
    print(f"  precompute bound at K={k} in {row['dtype']}: {row['ms_p50']:.2f} -> {row['ms_p50_precomputed']:.2f} ms "
          f"({row['speedup']:.2f}x), {row['bytes_per_document']} bytes per document", flush=True)
    return row


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


# -- 3. /search through a real server -----------------------------------------------------------------------
def scifact_test_queries(limit: int) -> list[str]:
    from sieve.index import read_qrels, read_queries

    qrels = read_qrels(SCIFACT / "qrels" / "test.tsv")
    queries = [text for qid, text in read_queries(SCIFACT / "queries.jsonl").items() if qid in qrels]
    return queries[:limit]


def build_scifact_index(out_dir: Path) -> None:
    """Same encoder and cache as the tests, so a warm cache makes this a few seconds."""
    from sieve.index import build_index, read_beir_corpus
    from sieve.models.text_encoder import EncoderLengths, TextEncoder
    from sieve.models.weights import default_model_path

    torch.manual_seed(SEED)
    encoder = TextEncoder.from_pretrained(default_model_path(), name="all-MiniLM-L6-v2",
                                         lengths=EncoderLengths(64, 256))
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    build_index(read_beir_corpus(SCIFACT / "corpus.jsonl"), encoder, out_dir, cache_dir=CACHE_DIR)


def post_search(client, query: str, params: dict) -> tuple[float, dict]:
    """Cache-Control: no-cache, so every mode encodes the query itself (without it be+cmc reused the query vector
    the be pass had cached and understated its latency by one query encoding)."""
    start = time.perf_counter()
    response = client.post("/search", json={"query": query, **params}, headers={"Cache-Control": "no-cache"})
    wall_ms = (time.perf_counter() - start) * 1000
    response.raise_for_status()
    return wall_ms, response.json()["timings_ms"]


def search_mode(client, queries: list[str], params: dict, warmup: int) -> dict:
    for query in queries[:warmup]:
        post_search(client, query, params)
    walls, stages = [], {}
    for query in queries:
        wall_ms, timings = post_search(client, query, params)
        walls.append(wall_ms)
        for stage, ms in timings.items():
            if ms is not None:
                stages.setdefault(stage, []).append(ms)
    return {"p50_ms": percentile(walls, 50), "p95_ms": percentile(walls, 95), "n": len(walls),
            "server_p50_ms": {stage: statistics.median(ms) for stage, ms in stages.items()}}


def search_latency(n_queries: int, warmup: int) -> dict:
    from tests.server import Server

    queries = scifact_test_queries(n_queries)
    with tempfile.TemporaryDirectory(prefix="sieve-bench-") as tmp:
        index_dir, log = Path(tmp) / "index", Path(tmp) / "server.log"
        build_scifact_index(index_dir)
        server = Server({"SIEVE_INDEX_DIR": str(index_dir), "SIEVE_CMC_PATH": "shipped:cmc"}, log)
        try:
            with server.client() as client:
                return {mode: search_mode(client, queries, params, warmup) for mode, params in SEARCH_MODES.items()}
        finally:
            server.stop()


# -- report -------------------------------------------------------------------------------------------------
def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    field = lambda key: next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()  # noqa: E731
                              if line.split(":", 1)[0].strip() == key), None)
    return {"cpu": models[0] if models else platform.processor(), "cpu_family": field("cpu family"),
            "cpu_model": field("model"), "cores": os.cpu_count(),
            "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c")),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "platform": platform.platform(), "load_avg_start": list(os.getloadavg())}


def rows_table(rows: list[dict]) -> str:
    lines = ["| K | p50 ms | FLOP-bound ms | ratio | lowered | p50 ms | ratio | Spearman | GFLOP | runs |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['k']} | {r['ms_p50']:.2f} | {r['flop_bound_ms']:.2f} | {r['ratio']:.2f} | {r.get('dtype', '-')} | "
              + (f"{r['ms_p50_lowered']:.2f} | {r['ratio_lowered']:.2f} | {r['spearman_lowered']:.4f}" if "dtype" in r else "- | - | -")
              + f" | {r['gflop']:.2f} | {r['runs']} |" for r in rows]
    return "\n".join(lines)


def search_table(search: dict) -> str:
    stages = sorted({s for m in search.values() for s in m["server_p50_ms"]})
    head = "| mode | n | p50 ms | p95 ms | " + " | ".join(f"server {s} p50" for s in stages) + " |"
    lines = [head, "|---" + "|---:" * (3 + len(stages)) + "|"]
    for mode, m in search.items():
        cells = [f"{m['server_p50_ms'][s]:.2f}" if s in m["server_p50_ms"] else "-" for s in stages]
        lines.append(f"| {mode} | {m['n']} | {m['p50_ms']:.2f} | {m['p95_ms']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer K, fewer runs, 20 queries")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "cmc_latency.json")
    parser.add_argument("--skip-search", action="store_true", help="only the matmul and CMC sections")
    parser.add_argument("--shared", action="store_true", help="record that other work ran on the machine meanwhile")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(SEED)
    info = machine()
    print(f"machine: {info}", flush=True)
    mm = matmul_gflops(runs=5 if args.quick else 10)
    print(f"matmul 2048^2 fp32: best {mm['best']:.1f} GFLOP/s, median {mm['median']:.1f}", flush=True)
    ks = QUICK_KS if args.quick else KS
    budget = (0.5, 2, 10) if args.quick else (10.0, 3, 200)  # seconds per K, min runs, max runs
    rows = cmc_rows(ks, mm["best"], *budget)
    rss = peak_rss_mb()  # before the search section, whose encoder load would dominate it
    precompute = precompute_bound(runs=20 if args.quick else 100)
    search = {} if args.skip_search else search_latency(20 if args.quick else 300, 3 if args.quick else 10)
    info["load_avg_end"] = list(os.getloadavg())
    info["shared"] = args.shared
    result = {"machine": info, "gflops": mm["best"], "gflops_median": mm["median"], "target": TARGET,
              "rows": rows, "precompute_bound": precompute, "peak_rss_mb": rss, "peak_rss_after_k": ks[-1], "search": search,
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]), "quick": args.quick}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nmatmul: {mm['best']:.1f} GFLOP/s (best of {mm['runs']}), torch threads {info['torch_threads']}")
    print(rows_table(rows))
    print(f"\npeak RSS after K={ks[-1]}: {rss:.0f} MB")
    if search:
        print("\n" + search_table(search))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
