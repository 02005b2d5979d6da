"""In-process kernel figures for benchmarks/gpu.py, on one device: the models loaded exactly as `sieve serve` loads
them (service/components.py: precision, buckets, the device's limits), then timed alone.

- cross-encoder forward alone over 100 and 512 (query, passage) pairs, and tokenizing those pairs
- CMC forward vs K (512, 10,000, 16,384): the paper-style shape (sieve/checkpoints/cmc/config.json, random gates:
  the shape is what costs) in the served precision, and the served CMC
- exact search of the index: FAISS on the CPU against the device's flat search (index/device_flat.py), and how many
  of FAISS's top-512 the device finds (fp16 on CUDA may swap hits within ~1e-3)
- the speed-up the start-up calibration measured and the limits it gives (service/limits.py)

    SIEVE_INDEX_DIR=... python benchmarks/gpu_micro.py --device cuda --queries Q.jsonl --corpus C.jsonl --out m.json
Model paths come from the environment (SIEVE_MODEL_PATH, SIEVE_CROSS_ENCODER_PATH, SIEVE_CMC_PATH) as for a server.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def timed_ms(fn, device, reps: int, warm: int = 2) -> float:
    """Median wall milliseconds of fn() on `device` (synchronised on CUDA)."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warm):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(1000 * (time.perf_counter() - start))
    return round(statistics.median(times), 3)


def texts_of(path: Path, field: str, n: int) -> list[str]:
    rows = [json.loads(line) for line, _ in zip(open(path), range(n))]
    return [(r.get("title", "") + " " + r[field]).strip() if field == "text" else r[field] for r in rows]


def cross_encoder_rows(ce, device, queries, docs, reps, pairs) -> list[dict]:
    import torch

    rows = []
    for n in pairs:
        qs, ds = [queries[i % len(queries)] for i in range(n)], [docs[i % len(docs)] for i in range(n)]
        tokenize_ms = timed_ms(lambda: ce.tokenize_pairs(qs, ds), torch.device("cpu"), reps=max(1, reps // 4), warm=1)
        batch = ce.tokenize_pairs(qs, ds)
        with torch.inference_mode():
            ms = timed_ms(lambda: ce.scorer(**batch), device, reps)
        rows.append({"pairs": n, "tokens": list(batch["input_ids"].shape), "forward_ms": ms,
                     "pairs_per_s": round(n / ms * 1000), "tokenize_ms": tokenize_ms})
    return rows


def cmc_rows(model, dim: int, device, ks, reps, dtype) -> list[dict]:
    import torch

    rows = []
    with torch.inference_mode():
        for k in ks:
            q = torch.nn.functional.normalize(torch.randn(1, dim, device=device), dim=-1).to(dtype)  # (1, d)
            c = torch.nn.functional.normalize(torch.randn(1, k, dim, device=device), dim=-1).to(dtype)  # (1, K, d)
            rows.append({"K": k, "ms": timed_ms(lambda: model(q, c), device, reps)})
    return rows


def paper_cmc(device):
    import torch

    from sieve.models.cmc import CMC, CMCConfig, randomize_gates

    cfg = json.loads((REPO / "sieve" / "checkpoints" / "cmc" / "config.json").read_text())["cmc"]
    cfg = {k: v for k, v in cfg.items() if k in CMCConfig.__dataclass_fields__} | {"evidence": 0, "dropout": 0.0}
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    return randomize_gates(CMC(CMCConfig(**cfg))).to(device, dtype).eval(), cfg["dim"], dtype


def search_rows(index_dir: Path, device, query_vectors, reps) -> dict:
    from sieve.index import SearchIndex

    with SearchIndex.load(index_dir) as cpu, SearchIndex.load(index_dir, flat_device=str(device)) as dev:
        k = min(512, cpu.size)
        one = query_vectors[:1]
        out = {"k": k, "faiss_cpu_ms": timed_ms(lambda: cpu.search(one, k), device, reps),
               "device_flat_ms": timed_ms(lambda: dev.search(one, k), device, reps),
               "device_segments": sum(s.device_flat is not None for s in dev._p.segments),
               "segments": len(dev._p.segments)}
        want, got = cpu.search(query_vectors, k)[1], dev.search(query_vectors, k)[1]
        out["top_k_overlap"] = round(sum(len(set(a) & set(b)) for a, b in zip(want, got)) / want.size, 5)
        out["top_1_equal"] = round(float((want[:, 0] == got[:, 0]).mean()), 5)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--ks", default="512,10000,16384")
    parser.add_argument("--pairs", default="100,512")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    from sieve.service.components import load_components
    from sieve.service.config import Settings

    settings = Settings(device=args.device)
    components = load_components(settings)
    device, searcher = torch.device(components.device), components.searcher
    queries, docs = texts_of(args.queries, "text", 64), texts_of(args.corpus, "text", 600)
    ks = [int(k) for k in args.ks.split(",")]
    res = {"device": str(device), "limits": components.limits.as_dict(), "precision": components.precision}
    if "ce" in searcher.models:
        res["cross_encoder"] = cross_encoder_rows(searcher.models["ce"], device, queries, docs, args.reps,
                                                  [int(n) for n in args.pairs.split(",")])
    model, dim, dtype = paper_cmc(device)
    rows = cmc_rows(model, dim, device, ks, args.reps, dtype)
    res["cmc_paper_shape"] = {"dim": dim, "dtype": str(dtype), "rows": rows}
    vectors = searcher.biencoder.encode_queries(queries).float().cpu().numpy()  # (Q, d)
    res["search"] = search_rows(settings.index_dir, device, vectors, args.reps)
    components.close()
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
