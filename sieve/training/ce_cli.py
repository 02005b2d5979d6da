"""`sieve train ce`: fine-tune the cross-encoder on one or more BEIR folders (see training/ce_train.py)."""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path


def register(commands) -> None:
    ce = commands.add_parser("ce", help="fine-tune the cross-encoder (LCE or BCE) on BEIR train splits",
                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ce.add_argument("--data", required=True, action="append", type=Path, help="BEIR folder; repeat to mix datasets")
    ce.add_argument("--out", required=True, type=Path, help="checkpoint directory (also holds state/ and logs)")
    ce.add_argument("--loss", choices=["lce", "bce"], default="lce", help="group softmax, or point-wise 1/0 labels")
    ce.add_argument("--negatives", type=int, default=7, help="hard negatives per positive")
    ce.add_argument("--neg-pool", type=int, default=100, help="negatives come from the bi-encoder's top-k")
    ce.add_argument("--batch-groups", type=int, default=4, help="groups per forward pass")
    ce.add_argument("--grad-accum", type=int, default=1, help="forward passes per optimizer step")
    ce.add_argument("--lr", type=float, default=2e-5)
    ce.add_argument("--epochs", type=int, default=1)
    ce.add_argument("--max-steps", type=int, help="cap on optimizer steps")
    ce.add_argument("--time-budget-min", type=float, help="stop, evaluate and save once this much time is spent")
    ce.add_argument("--max-length", type=int, default=256, help="pair tokens while training (serving uses 512)")
    ce.add_argument("--dev-queries", type=int, default=100, help="dev queries per dataset")
    ce.add_argument("--k-dev", type=int, default=20, help="bi-encoder candidates reranked on dev")
    ce.add_argument("--eval-every", type=int, default=0, help="steps between dev passes (0: at epoch ends only)")
    ce.add_argument("--log-every", type=int, default=10, help="steps between loss lines in train_log.jsonl")
    ce.add_argument("--seed", type=int, default=0)
    ce.add_argument("--resume", action="store_true", help="continue from OUT/state")
    ce.add_argument("--init", type=Path, help="start from this sequence-classification checkpoint")
    ce.add_argument("--head", choices=["cls", "cls+late", "emb", "cls+cos", "gated", "gated+late"], default="cls",
                    help="cls: one logit on [CLS]; cls+late: plus late interaction over the last-layer tokens "
                         "(Zhang, Li, Lin 2023), both trained with the loss, summed at inference; emb: dot product "
                         "of contextualised query and document marker tokens (Yadav et al. 2022, for annCUR); "
                         "cls+cos: plus scaled cosine of the mean query and mean document states (learns from "
                         "MiniLM's mean-pooled init at once, models/ce_cos.py); gated: starts as the bi-encoder and learns "
                         "gated attention across query and document (models/ce_gated.py); gated+late: gated plus late "
                         "interaction whose weight starts at 0 (models/ce_gated_late.py)")
    ce.add_argument("--head-lr", type=float, default=1e-3,
                    help="learning rate of a head's own new parameters (gated: the cross-attention gates and scale)")
    ce.add_argument("--late-dim", type=int, default=128, help="cls+late, gated+late: token projection size (0 = no projection)")
    ce.set_defaults(func=cmd_train_ce)


def config_from_args(args: argparse.Namespace):
    from sieve.training.ce_train import CETrainConfig

    for name in ("negatives", "neg_pool", "batch_groups", "grad_accum", "epochs", "max_length", "dev_queries", "k_dev", "log_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.late_dim < 0:
        raise ValueError("--late-dim must be 0 (no projection) or a positive size")
    return CETrainConfig(
        data_dirs=tuple(args.data), out_dir=args.out, loss=args.loss, negatives=args.negatives,
        neg_pool=args.neg_pool, batch_groups=args.batch_groups, grad_accum=args.grad_accum, lr=args.lr,
        epochs=args.epochs, max_steps=args.max_steps, time_budget_min=args.time_budget_min,
        max_length=args.max_length, dev_queries=args.dev_queries, k_dev=args.k_dev, eval_every=args.eval_every,
        log_every=args.log_every, seed=args.seed, resume=args.resume, init=args.init, command=command_line(args),
        head=args.head, late_dim=args.late_dim or None, head_lr=args.head_lr)


def command_line(args: argparse.Namespace) -> str:
    """An equivalent `sieve train ce` line rebuilt from the parsed values (defaults included), for the model card:
    sys.argv is not the command when main() is called with an argument list."""
    parts = ["sieve", "train", "ce"]
    for key, value in vars(args).items():
        if key in ("command", "train_command", "func", "command_line") or value is None or value is False:
            continue
        for item in value if isinstance(value, list) else [value]:
            parts += [f"--{key.replace('_', '-')}"] + ([] if item is True else [str(item)])
    return shlex.join(parts)


def cmd_train_ce(args: argparse.Namespace, settings) -> None:
    import torch

    from sieve.models.device import pick_device
    from sieve.service.components import load_biencoder
    from sieve.training.ce_train import train_cross_encoder

    cfg = config_from_args(args)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    device = pick_device(settings.device)
    summary = train_cross_encoder(cfg, load_biencoder(settings, device), cache_dir=settings.cache_dir, device=device)
    write_model_card(cfg, summary)
    print(json.dumps(summary))


def write_model_card(cfg, summary: dict) -> None:
    """model_card.md beside the weights: what it was trained on, how, and how it compares with the bi-encoder."""
    from dataclasses import asdict

    from sieve.training.checkpointing import git_commit

    be, ce = summary["be_ndcg@10"], summary["dev_ndcg@10"]
    rows = "\n".join(f"| {name} | {be[name]:.4f} | {ce[name]:.4f} |" for name in be)
    data = "\n".join(f"- `{d['name']}` ({d['path']}): {d['train_queries']} train queries, {d['dev_queries']} dev "
                     f"queries, {d['documents']} documents" for d in summary["data"])
    params = json.dumps({k: v for k, v in asdict(cfg).items() if k not in ("command", "resume")}, indent=2, default=str)
    head = cfg.head + (f" (late-interaction projection: {cfg.late_dim or 'none'})" if cfg.head.endswith("+late") else "")
    text = f"""# Cross-encoder `{Path(cfg.out_dir).name}`

Fine-tuned from {cfg.init or "the packaged all-MiniLM-L6-v2 (with a new head)"} with the
{cfg.loss.upper()} loss; head `{head}` (models/ce_heads.py); weights stored as fp16 safetensors. Best checkpoint: step
{summary['best_step']} of {summary['steps']} (stopped: {summary['stop']}).

## Data
{data}

Negatives: the bi-encoder's top {cfg.neg_pool}, judged-relevant documents removed. Test splits were not read.

## Dev nDCG@10 (the CE reranks the bi-encoder's top {cfg.k_dev}; pairs cut to {cfg.max_length} tokens)
| dataset | bi-encoder | cross-encoder |
|---|---|---|
{rows}

## Run
- command: `{cfg.command}`
- git commit: {git_commit()}
- optimizer steps: {summary['steps']}, pairs seen: {summary['pairs']}, {summary['pairs_per_s']:.1f} pairs/s
- wall time: {summary['wall_s'] / 60:.1f} min (all invocations together)

## Hyper-parameters
```json
{params}
```
"""
    (Path(cfg.out_dir) / "model_card.md").write_text(text, encoding="utf-8")
