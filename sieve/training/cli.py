"""`sieve train ...` sub-commands; each trainer module registers its own parser."""
from __future__ import annotations

from sieve.training import ce_cli, cmc_cli, fusion_cli


def register(sub):
    """The `train` sub-commands of the core; returns their subparsers so research trainers can add theirs."""
    train = sub.add_parser("train", help="train CMC, the cross-encoder or the MixEncoder on BEIR data")
    commands = train.add_subparsers(dest="train_command", required=True)
    cmc_cli.register(commands)
    ce_cli.register(commands)
    fusion_cli.register(commands)
    return commands
