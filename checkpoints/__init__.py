"""Trained default checkpoints shipped with Sieve: fp16 safetensors, each folder with a model card (data, command,
commit, metrics). They load when the matching setting is unset (SIEVE_CMC_PATH, SIEVE_CROSS_ENCODER_PATH).

    cmc/             CMC attention layers (layers regime: the towers are the packaged bi-encoder itself)
    cross-encoder/   cross-encoder trained from the packaged MiniLM on SciFact (head gated, LCE)
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
CMC = ROOT / "cmc"
CROSS_ENCODER = ROOT / "cross-encoder"


def shipped(path: Path) -> Path | None:
    """`path` when that default is in this installation (a checkpoint directory with its config.json), else None."""
    return path if (path / "config.json").is_file() else None
