"""`sieve train mix`: train the MixEncoder on one or more BEIR folders (see training/mix_train.py)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from sieve.training.ce_cli import command_line


def register(commands) -> None:
    mix = commands.add_parser("mix", help="train the MixEncoder (in-batch + hard negatives) on BEIR train splits",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    mix.add_argument("--data", required=True, action="append", type=Path, help="BEIR folder; repeat to mix datasets")
    mix.add_argument("--out", required=True, type=Path, help="checkpoint directory (also holds state/ and logs)")
    mix.add_argument("--contexts", type=int, default=1, help="k: context embeddings stored per document")
    mix.add_argument("--interaction-layers", type=int, default=1, help="the encoder's last L layers interact")
    mix.add_argument("--scale", type=float, default=20.0, help="training logits = scale * cosine")
    mix.add_argument("--no-in-batch", action="store_true", help="each query's softmax over its own group only")
    mix.add_argument("--negatives", type=int, default=7, help="hard negatives per positive")
    mix.add_argument("--neg-pool", type=int, default=100, help="negatives come from the bi-encoder's top-k")
    mix.add_argument("--batch-groups", type=int, default=4, help="groups per forward pass (in-batch: all score all)")
    mix.add_argument("--grad-accum", type=int, default=1, help="forward passes per optimizer step")
    mix.add_argument("--lr", type=float, default=2e-5)
    mix.add_argument("--epochs", type=int, default=1)
    mix.add_argument("--max-steps", type=int, help="cap on optimizer steps")
    mix.add_argument("--time-budget-min", type=float, help="stop, evaluate and save once this much time is spent")
    mix.add_argument("--max-length", type=int, default=256, help="document tokens, [CTX] tokens included")
    mix.add_argument("--dev-queries", type=int, default=100, help="dev queries per dataset")
    mix.add_argument("--k-dev", type=int, default=20, help="bi-encoder candidates reranked on dev")
    mix.add_argument("--eval-every", type=int, default=0, help="steps between dev passes (0: at epoch ends only)")
    mix.add_argument("--log-every", type=int, default=10, help="steps between loss lines in train_log.jsonl")
    mix.add_argument("--seed", type=int, default=0)
    mix.add_argument("--resume", action="store_true", help="continue from OUT/state")
    mix.add_argument("--init", type=Path, help="a MixEncoder checkpoint to continue, or an encoder directory")
    mix.set_defaults(func=cmd_train_mix)


def config_from_args(args: argparse.Namespace):
    from sieve.research.mix.train import MixTrainConfig

    for name in ("contexts", "interaction_layers", "negatives", "neg_pool", "batch_groups", "grad_accum", "epochs",
                 "max_length", "dev_queries", "k_dev", "log_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.scale <= 0:
        raise ValueError("--scale must be positive")
    return MixTrainConfig(
        data_dirs=tuple(args.data), out_dir=args.out, negatives=args.negatives, neg_pool=args.neg_pool,
        batch_groups=args.batch_groups, grad_accum=args.grad_accum, lr=args.lr, epochs=args.epochs,
        max_steps=args.max_steps, time_budget_min=args.time_budget_min, max_length=args.max_length,
        dev_queries=args.dev_queries, k_dev=args.k_dev, eval_every=args.eval_every, log_every=args.log_every,
        seed=args.seed, resume=args.resume, init=args.init,
        command="sieve train mix" + command_line(args).removeprefix("sieve train ce"),
        contexts=args.contexts, interaction_layers=args.interaction_layers, scale=args.scale,
        in_batch=not args.no_in_batch)


def cmd_train_mix(args: argparse.Namespace, settings) -> None:
    import torch

    from sieve.models.device import pick_device
    from sieve.service.components import load_biencoder
    from sieve.training.ce_train import train_cross_encoder
    from sieve.research.mix.train import MixTrainer

    cfg = config_from_args(args)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    device = pick_device(settings.device)
    summary = train_cross_encoder(cfg, load_biencoder(settings, device), cache_dir=settings.cache_dir, device=device,
                                  trainer_cls=MixTrainer)
    write_model_card(cfg, summary)
    print(json.dumps(summary))


def write_model_card(cfg, summary: dict) -> None:
    from dataclasses import asdict

    from sieve.training.checkpointing import git_commit

    be, mix = summary["be_ndcg@10"], summary["dev_ndcg@10"]
    rows = "\n".join(f"| {name} | {be[name]:.4f} | {mix[name]:.4f} |" for name in be)
    data = "\n".join(f"- `{d['name']}` ({d['path']}): {d['train_queries']} train queries, {d['dev_queries']} dev "
                     f"queries, {d['documents']} documents" for d in summary["data"])
    params = json.dumps({k: v for k, v in asdict(cfg).items() if k not in ("command", "resume", "loss", "head", "late_dim")},
                        indent=2, default=str)
    text = f"""# MixEncoder `{Path(cfg.out_dir).name}`

Trained from {cfg.init or "the packaged all-MiniLM-L6-v2"} with {cfg.contexts} context embedding(s) per document
and {cfg.interaction_layers} interaction layer(s), cross-entropy over {"in-batch plus hard" if cfg.in_batch else "hard"}
negatives (logits = {cfg.scale:g} x cosine); weights stored as fp16 safetensors. Best checkpoint: step
{summary['best_step']} of {summary['steps']} (stopped: {summary['stop']}).

Serve it with `SIEVE_MIX_PATH={cfg.out_dir}` over an index holding its context embeddings
(`sieve index add-store --index DIR --mix-checkpoint {cfg.out_dir}`).

## Data
{data}

Negatives: the bi-encoder's top {cfg.neg_pool}, judged-relevant documents removed. Test splits were not read.

## Dev nDCG@10 (the MixEncoder reranks the bi-encoder's top {cfg.k_dev}; documents cut to {cfg.max_length} tokens)
| dataset | bi-encoder | MixEncoder |
|---|---|---|
{rows}

## Run
- command: `{cfg.command}`
- git commit: {git_commit()}
- optimizer steps: {summary['steps']}, documents seen: {summary['pairs']}, {summary['pairs_per_s']:.1f} documents/s
- wall time: {summary['wall_s'] / 60:.1f} min (all invocations together)

## Hyper-parameters
```json
{params}
```
"""
    (Path(cfg.out_dir) / "model_card.md").write_text(text, encoding="utf-8")
