"""`sieve train fusion`: a CMC that fuses the hybrid first stage's evidence (training/fusion.py).

Mines the served hybrid candidates once, trains each variant on them, and writes one checkpoint per variant
(layers and evidence weights only; the towers are the bi-encoder) plus `report.json` with every dev curve.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

VARIANTS = ("linear", "mlp", "full", "full+noise", "full+init")  # +noise: --noise; +init: layers from the shipped CMC


def register(commands) -> None:
    p = commands.add_parser("fusion", help="train a CMC that fuses BM25 and bi-encoder evidence (hybrid candidates)")
    p.add_argument("--data", action="append", required=True, type=Path, help="BEIR folder (repeat to mix datasets)")
    p.add_argument("--out", required=True, type=Path, help="one checkpoint per variant under OUT/<variant>")
    p.add_argument("--variants", default="linear,full,full+noise",
                   help=f"comma-separated, from {','.join(VARIANTS)} (default linear,full,full+noise)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--noise", type=float, default=0.05, help="std of candidate-vector noise for +noise variants")
    p.add_argument("--unseen-dev", type=int, default=100, help="unseen-document dev queries carved out per dataset")
    p.add_argument("--depth", type=int, default=100, help="hybrid depth, as SIEVE_HYBRID_DEPTH serves it")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate of the evidence weights")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_fusion)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_fusion(args: argparse.Namespace, settings) -> None:
    from contextlib import ExitStack, closing

    from sieve.evaluation.dataset import load_split
    from sieve.evaluation.local import load_local
    from sieve.models.cmc_checkpoint import CMCBundle, load_cmc, save_cmc
    from sieve.training.fusion import FusionConfig, first_stage_ndcg, mine, train, unseen_split

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"unknown variant(s) {unknown or args.variants!r}; allowed: {', '.join(VARIANTS)}")
    if any(d.resolve().name.lower() == "arguana" for d in args.data):
        raise ValueError("ArguAna only reports transfer: never train or select on it")
    train_lists, dev_lists, data_notes = [], [], []
    settings = settings.model_copy(update={"hybrid_depth": args.depth})  # the lists it was trained on: top depth of each
    with ExitStack() as stack:
        for data_dir in args.data:
            name = data_dir.resolve().name
            components = stack.enter_context(closing(load_local(settings, name, data_dir / "corpus.jsonl")))
            searcher = components.searcher
            full = load_split(data_dir, "train")
            train_ids, dev_ids = unseen_split(full.qrels, args.unseen_dev, args.seed)
            pick = lambda ids: ({q: full.queries[q] for q in sorted(ids)}, {q: full.qrels[q] for q in sorted(ids)})  # noqa: E731
            train_lists.append(mine(searcher, name, *pick(train_ids), args.depth))
            dev_lists.append(mine(searcher, f"{name}-unseen-dev", *pick(dev_ids), args.depth))
            note = f"{data_dir}: train {len(train_lists[-1].ids)} queries, unseen-document dev {len(dev_lists[-1].ids)}"
            if (data_dir / "qrels" / "dev.tsv").is_file():
                dev = load_split(data_dir, "dev")
                dev_lists.append(mine(searcher, f"{name}-dev", dev.queries, dev.qrels, args.depth))
                note += f", dev split {len(dev_lists[-1].ids)}"
            data_notes.append(note + " (queries whose hybrid candidates hold a relevant document)")
            log(data_notes[-1])
            biencoder = searcher.biencoder
        shipped = None
        if any(v.endswith("+init") for v in variants):
            shipped = load_cmc(settings.resolved_cmc_path(), biencoder).model
    report = {"command": shlex.join(["sieve", "train", "fusion", *sys.argv[3:]]), "data": data_notes,
              "first_stage_dev": first_stage_ndcg(dev_lists), "variants": {}}
    log(f"hybrid order on the dev lists: {report['first_stage_dev']}")
    for variant in variants:
        cfg = FusionConfig(regime=variant.split("+")[0], depth=args.depth, steps=args.steps, seed=args.seed, lr=args.lr,
                           noise=args.noise if variant.endswith("+noise") else 0.0, unseen_dev=args.unseen_dev)
        model, result = train(cfg, train_lists, dev_lists, biencoder.dim, biencoder.device,
                              init_layers=shipped if variant.endswith("+init") else None, log=log)
        bundle = CMCBundle(model.cfg, model, biencoder, None, f"cmc-fusion-{variant}", biencoder.weights_hash)
        meta = {"trainer": "sieve train fusion", "variant": variant, "data": data_notes,
                "command": report["command"], "first_stage_dev": report["first_stage_dev"],
                **{k: result[k] for k in ("best_step", "best_dev_macro", "config")}}
        save_cmc(bundle, args.out / variant.replace("+", "-"), towers_from_base=True, metadata=meta)
        report["variants"][variant] = result
        log(f"{variant}: best dev macro nDCG@10 {result['best_dev_macro']:.4f} at step {result['best_step']} "
            f"(hybrid order {report['first_stage_dev']['macro']:.4f})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({v: {"best_dev_macro": round(r["best_dev_macro"], 4), "best_step": r["best_step"]}
                      for v, r in report["variants"].items()}, indent=2))
