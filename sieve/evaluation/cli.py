"""`sieve eval` is registered by the evaluation runner."""
from __future__ import annotations

from sieve.evaluation.runner_cli import register

__all__ = ["register"]
