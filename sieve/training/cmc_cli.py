"""`sieve train cmc` (labelled BEIR data) and `sieve train cmc-distill` (a cross-encoder as teacher, no labels).

Every option left out keeps the CMCTrainConfig default, so the defaults live in one place (training.cmc_train).
"""
from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from sieve.training.choices import OBJECTIVES, REGIMES

if TYPE_CHECKING:
    from sieve.training.cmc_train import CMCTrainConfig

# option -> CMCTrainConfig field (argparse's dest is the field name)
COMMON = {
    "--regime": dict(choices=REGIMES, help="layers: attention layers only (fast); shared: + query tower; "
                                           "separate: + candidate tower (slow on CPU)"),
    "--epochs": dict(type=int), "--batch-size": dict(type=int, dest="batch_size"),
    "--lr": dict(type=float, help="learning rate of the CMC layers"),
    "--tower-lr": dict(type=float, dest="tower_lr", help="learning rate of the towers (shared, separate)"),
    "--k": dict(type=int, help="candidates per query"),
    "--max-steps": dict(type=int, dest="max_steps", help="stop after this many optimizer steps"),
    "--eval-every": dict(type=int, dest="eval_every", help="steps between dev evaluations (default: each epoch)"),
    "--patience": dict(type=int, help="evaluations without improvement before stopping"),
    "--dev-fraction": dict(type=float, dest="dev_fraction", help="held-out share of queries without a dev split"),
    "--warmup": dict(type=float, help="share of steps spent warming the learning rate up"),
    "--seed": dict(type=int),
}
LABELLED = {
    "--objective": dict(choices=OBJECTIVES, help="gold: one list per (query, relevant document), the other relevant "
                                                "documents kept out; listwise: one list per query, every relevant "
                                                "document in it a graded target"),
    "--pool": dict(type=int, help="candidates are mined from the bi-encoder's top POOL"),
    "--sample-temperature": dict(type=float, dest="sample_temperature",
                                 help="sampled candidates are drawn in proportion to exp(cosine / T)"),
    "--dev-k": dict(type=int, dest="dev_k", help="dev: CMC reranks the bi-encoder's top DEV_K (serving: retrieve_k)"),
    "--hard-fraction": dict(type=float, dest="hard_fraction", help="share of negatives fixed as the top-ranked"),
    "--lambda-ce": dict(type=float, dest="lambda_ce"), "--lambda-kl": dict(type=float, dest="lambda_kl"),
    "--metric": dict(choices=["ndcg@10", "mrr@10"], help="dev metric that selects the checkpoint"),
}


def register(commands) -> None:
    cmc = commands.add_parser("cmc", help="train CMC on BEIR train splits (dev split or held-out part for selection)")
    cmc.add_argument("--data", action="append", required=True, type=Path, help="BEIR folder (repeat to mix datasets)")
    add_run_args(cmc, {**COMMON, **LABELLED})
    cmc.set_defaults(func=cmd_cmc)

    distill = commands.add_parser("cmc-distill", help="distil a cross-encoder's scores into CMC (no labels needed)")
    distill.add_argument("--queries", required=True, type=Path, help="queries.jsonl (_id, text)")
    distill.add_argument("--corpus", required=True, type=Path, help="corpus.jsonl (_id, title, text)")
    distill.add_argument("--cross-encoder", required=True, type=Path, dest="cross_encoder",
                         help="teacher checkpoint dir")
    distill.add_argument("--split", help="keep only the queries of qrels/<split>.tsv next to the queries file")
    distill.add_argument("--max-queries", type=int, dest="max_queries", help="cap the queries (the teacher costs "
                                                                             "~0.7 s per query at K=32 on a CPU)")
    distill.add_argument("--temperature", type=float, help="softmax temperature of the listwise KL")
    add_run_args(distill, COMMON)
    distill.set_defaults(func=cmd_distill, k=32)


def add_run_args(parser: argparse.ArgumentParser, options: dict) -> None:
    parser.add_argument("--out", required=True, type=Path, help="checkpoint directory (also holds state/ and logs)")
    parser.add_argument("--resume", action="store_true", help="continue from the last state saved in --out")
    for flag, kwargs in options.items():
        parser.add_argument(flag, default=None, **kwargs)


def config_from(args: argparse.Namespace) -> "CMCTrainConfig":
    from sieve.training.cmc_train import CMCTrainConfig

    given = {f.name: getattr(args, f.name) for f in fields(CMCTrainConfig) if getattr(args, f.name, None) is not None}
    return CMCTrainConfig(**given)


def command_line(args) -> str:
    return args.command_line  # set by sieve.cli.main from the argument list it parsed


def setup(settings):
    import torch

    from sieve.models.device import pick_device
    from sieve.service.components import load_biencoder

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    device = pick_device(settings.device)
    return device, load_biencoder(settings, device)


def cmd_cmc(args: argparse.Namespace, settings) -> None:
    from sieve.training.cmc_train import train_cmc

    device, biencoder = setup(settings)
    result = train_cmc(config_from(args), args.data, biencoder, args.out, cache_dir=settings.cache_dir,
                       resume=args.resume, command=command_line(args))
    metric = config_from(args).metric
    print(f"CMC checkpoint: {result.out_dir}")
    print(f"best dev {metric}: {result.metrics.get(metric, float('nan')):.4f} at step {result.best_step} of "
          f"{result.steps} (bi-encoder {result.metrics.get('be_' + metric, float('nan')):.4f}); "
          f"{result.wall_s:.0f} s on {device}")


def cmd_distill(args: argparse.Namespace, settings) -> None:
    from sieve.models.cross_encoder import CrossEncoder
    from sieve.training.cmc_train import train_distill

    device, biencoder = setup(settings)
    teacher = CrossEncoder.from_pretrained(args.cross_encoder, device=device, batch_size=settings.ce_batch_size,
                                           lengths=settings.ce_lengths(args.cross_encoder))
    result = train_distill(config_from(args), args.queries, args.corpus, teacher, biencoder, args.out,
                           split=args.split, max_queries=args.max_queries, cache_dir=settings.cache_dir,
                           resume=args.resume, command=command_line(args))
    m = {k: result.metrics.get(k, float("nan")) for k in ("kl", "be_kl", "top1_agreement", "be_top1_agreement")}
    print(f"CMC checkpoint: {result.out_dir}")
    print(f"best dev KL to the teacher: {m['kl']:.4f} at step {result.best_step} of {result.steps} "
          f"(bi-encoder {m['be_kl']:.4f}); top-1 agreement {m['top1_agreement']:.3f} "
          f"(bi-encoder {m['be_top1_agreement']:.3f}); {result.wall_s:.0f} s on {device}")
