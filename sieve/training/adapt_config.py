"""`sieve adapt`'s training configuration, light to import (no torch, numpy or faiss): the command line takes its
options' defaults from here, so `sieve adapt --help` answers at once. The training itself is training/adapt.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sieve.training.choices import STARTS

if TYPE_CHECKING:
    from sieve.models.cmc import CMCConfig


@dataclass
class AdaptConfig:
    generator: str = "ict"  # the only generator whose queries are no quote of their positive (RESULTS.md)
    per_doc: int = 1  # pseudo-queries per document
    max_queries: int = 20000
    heldout: float = 0.1  # share of documents kept out of training for selection (at most heldout_max)
    heldout_max: int = 300
    k: int = 512  # candidates per list: the served retrieve_k (selection ranks whole lists)
    train_k: int = 128  # training reads the top train_k of each list (first-stage order): 8x cheaper a step on a CPU
    n_layers: int = 1
    ffn_mult: int = 2
    steps: int = 600
    batch_queries: int = 16
    lr: float = 1e-3  # attention layers and evidence embedding
    evidence_lr: float = 1e-3  # the fusion weights it starts from
    dropout: float = 0.1
    eval_every: int = 50
    start: str = "fusion"
    teacher: float = 1.0  # weight of the shipped default's ranking of each whole list as a soft target (RESULTS.md)
    seed: int = 0

    def __post_init__(self):
        if self.start not in STARTS:
            raise ValueError(f"start {self.start!r} is not one of {STARTS}")

    def model_config(self, dim: int) -> "CMCConfig":
        from sieve.models.cmc import CMCConfig
        from sieve.pipeline.evidence import FEATURES

        return CMCConfig(mode="shared", dim=dim, n_layers=self.n_layers, ffn_mult=self.ffn_mult,
                         dropout=self.dropout, evidence=len(FEATURES), evidence_hidden=32)
