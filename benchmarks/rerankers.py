"""Rerankers on the same candidates: quality, latency and extra index memory of BE, BE+CMC, BE+CE, BE+CE(late)
and BE+MixEncoder over the bi-encoder's top `--depth` (64), MixEncoder and CMC also over the top 512; and the
cross-domain table of the cross-encoder with and without late interaction.

Every pipeline runs in this process through the service's own Searcher (the path `sieve eval` and /search use),
over an index of the dataset's corpus that also holds the MixEncoder's context embeddings (built once, cached).

    # the reranker table on one dataset (writes benchmarks/results/rerankers_<name>.json)
    python benchmarks/rerankers.py table --data ../shared/data/scifact --ce runs/ce --ce-late runs/ce-late \\
        --mix runs/mix [--cmc runs/cmc] [--max-queries 50] [--depth 64]
    # in- and out-of-domain: each checkpoint on each dataset's test split (rerankers_cross_domain.json)
    python benchmarks/rerankers.py cross-domain --data ../shared/data/scifact --data ../shared/data/nfcorpus \\
        --ce scifact=runs/ce-sf --ce nfcorpus=runs/ce-nf --ce-late scifact=runs/late-sf --ce-late nfcorpus=runs/late-nf

Metrics: nDCG@10, MRR@10, Recall@10 over the judged test queries (or a seeded sample, --max-queries); latency is
the Searcher's whole-request time per query (p50, p95), one query at a time; extra_index_bytes is what a stage adds
to the index beyond the bi-encoder's vectors (the MixEncoder's "mix" store; 0 for the others).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.cmc_latency import machine  # noqa: E402
from sieve.evaluation.backends import InProcessBackend  # noqa: E402
from sieve.evaluation.dataset import EvalData, load_split  # noqa: E402
from sieve.evaluation.metrics import mean_metric, mrr_at_k, ndcg_at_k, recall_at_k  # noqa: E402
from sieve.evaluation.runner import EvalConfig, pipeline as recipe  # noqa: E402

OUT_DIR = REPO / "benchmarks" / "results"
ITEMSIZE = {"float32": 4, "float16": 2}


def table_plan(depth: int, wide: int) -> list[tuple[str, str, EvalConfig]]:
    """(row label, pipeline, config): every reranker over the same BE top `depth`; MixEncoder and CMC over `wide` too."""
    narrow = EvalConfig(retrieve_k=depth, cmc_k=min(16, depth), ce_k=depth, top_k=depth)
    broad = EvalConfig(retrieve_k=wide, cmc_k=min(16, depth), ce_k=depth, top_k=min(100, wide))
    return [(f"be@{depth}", "be", narrow), (f"be+cmc@{depth}", "be+cmc", narrow), (f"be+ce@{depth}", "be+ce", narrow),
            (f"be+ce_late@{depth}", "be+ce_late", narrow), (f"be+mix@{depth}", "be+mix", narrow),
            (f"be+cmc@{wide}", "be+cmc", broad), (f"be+mix@{wide}", "be+mix", broad)]


def run_queries(searcher, pipeline: str, data: EvalData, cfg: EvalConfig, label: str) -> dict:
    """One warm-up query, then every query one at a time; quality from the rankings, latency from the Searcher."""
    spec = recipe(pipeline)
    searcher.search(spec.params(next(iter(data.queries.values())), cfg))
    rankings, totals, stages = {}, [], {}
    for qid, text in tqdm(data.queries.items(), desc=label, unit="q", leave=False):
        outcome = searcher.search(spec.params(text, cfg))
        rankings[qid] = outcome.index.ids(outcome.candidates.rows)
        totals.append(outcome.state.timings_ms["total"])
        for stage, ms in outcome.state.timings_ms.items():
            stages.setdefault(stage, []).append(ms)
    metric = lambda fn, k: mean_metric(fn, rankings, data.qrels, k)  # noqa: E731
    return {"ndcg@10": metric(ndcg_at_k, 10), "mrr@10": metric(mrr_at_k, 10), "recall@10": metric(recall_at_k, 10),
            "latency_ms_p50": float(np.percentile(totals, 50)), "latency_ms_p95": float(np.percentile(totals, 95)),
            "stage_ms_p50": {s: float(np.percentile(v, 50)) for s, v in stages.items()},
            "candidates": cfg.retrieve_k, "queries": len(rankings)}


def extra_index_bytes(index, pipeline: str) -> int:
    """Bytes a stage adds beyond the bi-encoder's vectors: the stores it reads."""
    from sieve.research.mix.runtime import STORE

    m = index.manifest
    stores = [STORE] if "mix" in pipeline.split("+") else []
    stores += ["cmc"] if "cmc" in pipeline.split("+") and "cmc" in m.stores else []
    return sum(m.count * int(m.stores[s]["dim"]) * ITEMSIZE[m.dtype] for s in stores)


def components_for(settings, data: EvalData):
    """The service's components over the cached eval index of the corpus (`sieve eval`'s own: with the MixEncoder's
    context store when SIEVE_MIX_PATH / --mix is set)."""
    from sieve.evaluation.local import load_local

    return load_local(settings, data.name, data.corpus_path)


def settings_for(args, **paths):
    from sieve.service.config import Settings

    return Settings(cmc_path=getattr(args, "cmc", None), **paths)


def cmd_table(args) -> dict:
    data = load_split(args.data, "test", name=args.name, max_queries=args.max_queries, seed=args.seed)
    settings = settings_for(args, cross_encoder_path=args.ce, late_ce_path=args.ce_late, mix_path=args.mix)
    components = components_for(settings, data)
    rows = []
    try:
        searcher = components.searcher
        loaded = InProcessBackend(searcher).stages
        for label, pipeline, cfg in table_plan(args.depth, args.wide):
            missing = [s for s in recipe(pipeline).needs if s not in loaded]
            if missing:
                print(f"skipping {label}: no {', '.join(missing)} configured", file=sys.stderr)
                continue
            started = time.perf_counter()
            row = {"stage": label, **run_queries(searcher, pipeline, data, cfg, label),
                   "extra_index_bytes": extra_index_bytes(searcher.index, pipeline)}
            rows.append(row)
            print(f"{label}: nDCG@10 {row['ndcg@10']:.4f} in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    finally:
        components.close()
    return {"dataset": data.name, "split": "test", "depth": args.depth, "rows": rows,
            "checkpoints": {"cmc": args.cmc, "ce": args.ce, "ce_late": args.ce_late, "mix": args.mix}}


def named_paths(items: list[str] | None, flag: str) -> list[tuple[str, Path]]:
    out = []
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"{flag} takes TRAIN_DATASET=CHECKPOINT_DIR, got {item!r}")
        out.append((name, Path(path)))
    return out


def table_row(out_dir: Path, data: EvalData, path: Path, args) -> dict | None:
    """The be+ce / be+ce_late row of this checkpoint in an already written rerankers_<dataset>.json made with the
    same depth, query sample and seed (the same numbers, not measured twice), else None."""
    file = out_dir / f"rerankers_{data.name}.json"
    if not file.is_file():
        return None
    doc = json.loads(file.read_text(encoding="utf-8"))
    if (doc.get("depth"), doc.get("max_queries"), doc.get("seed")) != (args.depth, args.max_queries, args.seed):
        return None
    for key, stage in (("ce", f"be+ce@{args.depth}"), ("ce_late", f"be+ce_late@{args.depth}")):
        if doc["checkpoints"].get(key) == str(path):
            row = next((r for r in doc["rows"] if r["stage"] == stage), None)
            if row is not None:
                return {k: v for k, v in row.items() if k not in ("stage", "extra_index_bytes")} | {"from": file.name}
    return None


def cmd_cross_domain(args) -> dict:
    """Each checkpoint (trained on one dataset) reranks each dataset's BE top `depth` through the plain CE stage; a
    row the table mode already measured (same checkpoint, depth, queries, seed) is taken from its JSON."""
    from sieve.models.ce_heads import read_head

    checkpoints = [(name, p) for flag in ("ce", "ce_late") for name, p in named_paths(getattr(args, flag), f"--{flag}")]
    cfg = EvalConfig(retrieve_k=args.depth, cmc_k=min(16, args.depth), ce_k=args.depth, top_k=args.depth)
    rows = []
    for data_dir in args.data:
        data = load_split(data_dir, "test", max_queries=args.max_queries, seed=args.seed)
        for train, path in checkpoints:
            head = read_head(path)["head"]
            result = table_row(args.out_dir, data, path, args)
            if result is None:
                components = components_for(settings_for(args, cross_encoder_path=path, cmc_enabled=False), data)
                try:
                    result = run_queries(components.searcher, "be+ce", data, cfg, f"{train}->{data.name} {head}")
                finally:
                    components.close()
            rows.append({"train": train, "test": data.name, "head": head, "domain": "in" if train == data.name else "out",
                         "checkpoint": str(path), **result})
            print(f"{head} {train} -> {data.name}: nDCG@10 {result['ndcg@10']:.4f}", file=sys.stderr)
    return {"split": "test", "depth": args.depth, "rows": rows}


def markdown(doc: dict) -> str:
    keys = ("ndcg@10", "mrr@10", "recall@10")
    if "dataset" in doc:
        header = "| stage | nDCG@10 | MRR@10 | R@10 | p50 ms | p95 ms | extra index bytes | queries |\n|---|---|---|---|---|---|---|---|"
        lines = [f"| {r['stage']} | " + " | ".join(f"{r[k]:.4f}" for k in keys) + f" | {r['latency_ms_p50']:.1f} | "
                 f"{r['latency_ms_p95']:.1f} | {r['extra_index_bytes']:,} | {r['queries']} |" for r in doc["rows"]]
    else:
        header = "| train | test | head | nDCG@10 | MRR@10 | R@10 | p50 ms | queries |\n|---|---|---|---|---|---|---|---|"
        lines = [f"| {r['train']} | {r['test']} | {r['head']} | " + " | ".join(f"{r[k]:.4f}" for k in keys)
                 + f" | {r['latency_ms_p50']:.1f} | {r['queries']} |" for r in doc["rows"]]
    return "\n".join([header, *lines])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    table = sub.add_parser("table", help="every reranker on one dataset's test split")
    table.add_argument("--data", required=True, type=Path)
    table.add_argument("--name", help="dataset name in the file name (default: the folder's name)")
    table.add_argument("--ce", type=Path, help="plain cross-encoder checkpoint")
    table.add_argument("--ce-late", type=Path, help="late-interaction cross-encoder checkpoint (cls+late, gated+late)")
    table.add_argument("--mix", type=Path, help="MixEncoder checkpoint")
    table.add_argument("--cmc", type=Path, help="CMC checkpoint (default: the untrained CMC, which ranks as BE)")
    table.add_argument("--wide", type=int, default=512, help="the larger candidate set for MixEncoder and CMC")
    cross = sub.add_parser("cross-domain", help="cross-encoders with and without late interaction, in and out of domain")
    cross.add_argument("--data", required=True, type=Path, action="append", help="BEIR folder; repeat")
    cross.add_argument("--ce", action="append", help="TRAIN_DATASET=DIR of a cross-encoder without late interaction; repeat")
    cross.add_argument("--ce-late", action="append", help="TRAIN_DATASET=DIR of one with late interaction (cls+late, "
                       "gated+late); repeat")
    for p in (table, cross):
        p.add_argument("--depth", type=int, default=64, help="bi-encoder candidates every reranker sees")
        p.add_argument("--max-queries", type=int, help="a seeded sample of the judged test queries")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    doc = {"machine": machine(), **(cmd_table(args) if args.mode == "table" else cmd_cross_domain(args))}
    doc.update({"max_queries": args.max_queries, "seed": args.seed, "created": dt.datetime.now(dt.timezone.utc).isoformat(),
                "command": shlex.join(["python", "benchmarks/rerankers.py", *argv])})
    name = doc.get("dataset", "cross_domain") if args.mode == "table" else "cross_domain"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"rerankers_{name}.json"
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    print(markdown(doc))
    print(f"wrote {out}", file=sys.stderr)
    return doc


if __name__ == "__main__":
    main()
