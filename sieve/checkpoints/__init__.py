"""Trained default checkpoints shipped with Sieve: fp16 safetensors, each folder with a model card (data, command,
commit, metrics). They load when the matching setting is unset (SIEVE_CMC_PATH, SIEVE_CROSS_ENCODER_PATH).

    cmc-fusion/      the default CMC: fuses the hybrid first stage's evidence (no attention layers; `sieve train fusion`)
    cmc/             the paper's CMC, attention layers only (layers regime: the towers are the packaged bi-encoder);
                     ranks well on the documents it trained on, not beyond them (RESULTS.md): SIEVE_CMC_PATH=shipped:cmc
    cross-encoder/   cross-encoder trained from the packaged MiniLM on SciFact (head gated, LCE)
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
CMC = ROOT / "cmc-fusion"
CMC_LISTWISE = ROOT / "cmc"
CROSS_ENCODER = ROOT / "cross-encoder"


def shipped(path: Path) -> Path | None:
    """`path` when that default is in this installation (a checkpoint directory with its config.json), else None."""
    return path if (path / "config.json").is_file() else None


def names() -> list[str]:
    """The checkpoints shipped in this installation (SIEVE_*_PATH=shipped:NAME)."""
    return sorted(p.name for p in ROOT.iterdir() if shipped(p))
