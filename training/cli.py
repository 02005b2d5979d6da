"""`sieve train ...` sub-commands. Each trainer module registers its own parser here."""
from __future__ import annotations


def register(sub) -> None:
    train = sub.add_parser("train", help="train CMC or the cross-encoder on BEIR data")
    commands = train.add_subparsers(dest="train_command", required=True)
    for module in trainer_modules():
        module.register(commands)


def trainer_modules() -> list:
    """Trainer CLIs that exist so far (each defines register(subparsers) and sets func=(args, settings))."""
    import importlib

    found = []
    for name in ("training.cmc_cli", "training.ce_cli"):
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return found
