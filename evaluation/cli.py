"""`sieve eval`: registered by the evaluation runner once it exists."""
from __future__ import annotations


def register(sub) -> None:
    try:
        from evaluation.runner_cli import register as register_eval
    except ModuleNotFoundError as exc:
        if exc.name != "evaluation.runner_cli":
            raise
        return
    register_eval(sub)
