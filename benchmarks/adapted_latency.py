"""What an index's adapted CMC (`sieve adapt`) costs when served, against the shipped fusion CMC (issue 35).

Part 1, the forward alone: the shipped fusion CMC and the index's adapted CMC at K candidates (default 512), one
query, one thread, CPU time per call (time.thread_time: other load on the machine inflates it far less than wall
time), the adapted one in every precision models/precision.py can give it here (fp32, bf16 in torch's fused
attention, bf16 chunked, int8), and the adapted bf16 forward cut into its steps.
Part 2, /search: one `sieve serve` per variant on the same index, one client, interleaved blocks of queries
(Cache-Control: no-cache): `adapted` (the index's adapted CMC as served: SIEVE_PRECISION=auto), `adapted-fp32`
(SIEVE_PRECISION=fp32), `shipped` (SIEVE_CMC_PATH=shipped:cmc-fusion, the default of an index never adapted) and
`be` (the bi-encoder alone on the shipped server: the latency target is default p50 <= 3x be-only p50, RESULTS.md).
Per variant: wall p50 / p95, the server's `cmc` stage p50, and the server process's CPU time per request
(/proc/PID/stat over each block). Usage:
  python benchmarks/adapted_latency.py --index <an adapted SciFact index> --queries ../shared/data/scifact/queries.jsonl \
      --out benchmarks/results/adapted_latency_intel_amx.json
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cmc_latency import machine  # noqa: E402
from benchmarks.default_latency import percentile  # noqa: E402
from sieve.index import read_queries  # noqa: E402

VARIANTS = {  # name -> (server environment, /search body)
    "adapted": ({"SIEVE_PRECISION": "auto"}, {}),
    "adapted-fp32": ({"SIEVE_PRECISION": "fp32"}, {}),
    "shipped": ({"SIEVE_PRECISION": "auto", "SIEVE_CMC_PATH": "shipped:cmc-fusion"}, {}),
    "be": ({"SIEVE_PRECISION": "auto", "SIEVE_CMC_PATH": "shipped:cmc-fusion"},
           {"retriever": "be", "rerank": "none", "cross_encoder": False}),
}
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_ms(fn, runs: int) -> float:
    """Median CPU time of this thread per call, after a warm-up."""
    for _ in range(max(5, runs // 10)):
        fn()
    times = []
    for _ in range(runs):
        started = time.thread_time()
        fn()
        times.append((time.thread_time() - started) * 1000)
    return float(np.median(times))


def forward_costs(index: Path, k: int, runs: int) -> dict:
    """Part 1: CPU ms per forward of each model and precision, and of each step of the adapted bf16 layer."""
    from sieve import checkpoints
    from sieve.index.adapted import current_adapted
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.models.precision import lowered, native_bf16
    from sieve.models.weights import default_model_path
    from sieve.models.text_encoder import TextEncoder

    torch.set_num_threads(1)
    biencoder = TextEncoder.from_pretrained(default_model_path(), name="all-MiniLM-L6-v2")
    fusion, adapted = (load_cmc(p, biencoder).model.eval() for p in (checkpoints.CMC, current_adapted(index)))
    gen = torch.Generator().manual_seed(0)
    query, cands = torch.randn(1, 384, generator=gen), torch.randn(1, k, 384, generator=gen)
    feats = torch.randn(1, k, adapted.cfg.evidence, generator=gen)
    models = {"shipped fusion fp32": fusion, "adapted fp32": adapted,
              "adapted int8": lowered(adapted, "int8", "layers")}
    if native_bf16():
        models["adapted bf16 fused attention"] = lowered(adapted, "bf16", "layers", chunked_attention=False)
        models["adapted bf16 chunked attention"] = lowered(adapted, "bf16", "layers", chunked_attention=True)
    with torch.inference_mode():
        rows = {name: round(cpu_ms(lambda m=m: m(query, cands, None, feats), runs), 3) for name, m in models.items()}
        steps = layer_steps(models.get("adapted bf16 fused attention", adapted), query, cands, feats, runs)
    return {"k": k, "threads": 1, "runs": runs, "cpu_ms_per_forward": rows, "adapted_config": adapted.cfg.to_dict(),
            "adapted_steps_cpu_ms": steps, "gflop_adapted_layer": round(layer_flop(adapted.cfg, k) / 1e9, 3)}


def layer_flop(cfg, k: int) -> float:
    """Multiply-adds x 2 of one CMC layer over 1 + k tokens: qkv, out, ffn and the attention itself."""
    tokens, d = k + 1, cfg.dim
    return 2.0 * cfg.n_layers * (tokens * d * d * (4 + 2 * cfg.ffn_mult) + 2 * tokens * tokens * d)


def layer_steps(model, query, cands, feats, runs: int) -> dict:
    """CPU ms of each step of the forward (the first layer as served: bf16 where lowered)."""
    layer = model.layers[0]
    inner, dtype = getattr(layer, "inner", layer), getattr(layer, "dtype", torch.float32)
    x = torch.cat([query.unsqueeze(1), cands + model.evidence.embed(feats)], 1).to(dtype)  # (1, 1+K, d)
    B, L, d = x.shape
    qkv = inner.qkv(x)
    q, k, v = qkv.view(B, L, 3, inner.n_heads, d // inner.n_heads).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, d)
    h = inner.norm_attn(x + inner.out(a))
    g = F.gelu(inner.ff_in(h))
    steps = {"evidence embed + concat": lambda: torch.cat([query.unsqueeze(1), cands + model.evidence.embed(feats)], 1),
             "qkv linear": lambda: inner.qkv(x), "attention (sdpa)": lambda: F.scaled_dot_product_attention(q, k, v),
             "out linear": lambda: inner.out(a), "layer norms (2)": lambda: (inner.norm_attn(x), inner.norm_ff(x)),
             "ffn in + gelu": lambda: F.gelu(inner.ff_in(h)), "ffn out": lambda: inner.ff_out(g),
             "score + evidence fusion": lambda: model.evidence.score(feats, torch.einsum("bd,bkd->bk", query, cands))}
    return {name: round(cpu_ms(fn, runs), 3) for name, fn in steps.items()}


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime + stime of every thread


def search_latency(index: Path, queries: list[str], blocks: int, per_block: int, variants: list[str]) -> dict:
    """Part 2: /search per variant, interleaved blocks; wall, server cmc stage and server CPU per request."""
    from tests.server import Server

    servers, with_clients = {}, {}
    wall, stage, cpu = ({v: [] for v in variants} for _ in range(3))
    headers = {"Cache-Control": "no-cache"}
    with tempfile.TemporaryDirectory() as logs:
        try:
            for env in {json.dumps(VARIANTS[v][0], sort_keys=True) for v in variants}:
                servers[env] = Server({"SIEVE_INDEX_DIR": str(index), **json.loads(env)},
                                      Path(logs) / f"{len(servers)}.log", shipped_models=True)
            clients = {v: servers[json.dumps(VARIANTS[v][0], sort_keys=True)] for v in variants}
            with_clients = {v: clients[v].client() for v in variants}
            ready = {v: with_clients[v].get("/readyz").json() for v in variants}
            for text in queries[:10]:  # warm-up: thread pools, allocator
                for v in variants:
                    with_clients[v].post("/search", json={"query": text, **VARIANTS[v][1]}, headers=headers)
            for block in range(blocks):
                chunk = queries[(block * per_block) % len(queries):][:per_block]
                for v in variants:
                    pid, client = clients[v].proc.pid, with_clients[v]
                    before = process_cpu_s(pid)
                    for text in chunk:
                        started = time.perf_counter()
                        body = {"query": text, "top_k": 10, **VARIANTS[v][1]}
                        answer = client.post("/search", json=body, headers=headers)
                        wall[v].append((time.perf_counter() - started) * 1000)
                        assert answer.status_code == 200, answer.text
                        stage[v].append(answer.json()["timings_ms"].get("cmc", 0.0))
                    cpu[v].append((process_cpu_s(pid) - before) * 1000 / len(chunk))
        finally:
            for client in with_clients.values():
                client.close()
            for server in servers.values():
                server.stop()
    return {v: {"requests": len(wall[v]), "p50_ms": round(statistics.median(wall[v]), 2),
                "p95_ms": round(percentile(wall[v], 95), 2), "cmc_stage_p50_ms": round(statistics.median(stage[v]), 2),
                "server_cpu_ms_per_request": round(statistics.median(cpu[v]), 2),
                "cmc": {key: ready[v]["cmc"][key] for key in ("name", "source")},
                "cmc_precision": ready[v]["precision"].get("cmc", {}).get("dtype")} for v in variants}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="an index with an adapted CMC and a BM25 part")
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--k", type=int, default=512, help="candidates of the forward in part 1")
    parser.add_argument("--runs", type=int, default=200, help="forwards per model in part 1")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--per-block", type=int, default=25, help="queries per variant per block")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--skip-forward", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    info = machine()
    forward = None if args.skip_forward else forward_costs(args.index, args.k, args.runs)
    if forward:
        print(f"| forward, K={args.k}, 1 thread | CPU ms |\n|---|---:|")
        for name, value in {**forward["cpu_ms_per_forward"], **forward["adapted_steps_cpu_ms"]}.items():
            print(f"| {name} | {value} |")
    texts = list(read_queries(args.queries).values())
    search = search_latency(args.index, texts, args.blocks, args.per_block, args.variants.split(","))
    be = search.get("be", {}).get("p50_ms")
    print("\n| /search | requests | p50 ms | p95 ms | cmc stage p50 ms | server CPU ms / request | CMC dtype "
          "| p50 / be |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for name, r in search.items():
        ratio = f"{r['p50_ms'] / be:.2f}" if be else "-"
        print(f"| {name} | {r['requests']} | {r['p50_ms']} | {r['p95_ms']} | {r['cmc_stage_p50_ms']} | "
              f"{r['server_cpu_ms_per_request']} | {r['cmc_precision']} | {ratio} |")
    if args.out:
        doc = {"machine": {**info, "load_avg_end": list(os.getloadavg())}, "index": str(args.index),
               "command": shlex.join(["python", *sys.argv]), "forward": forward, "search": search,
               "blocks": args.blocks, "per_block": args.per_block, "clients": 1}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
