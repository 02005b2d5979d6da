"""MixEncoder training: the cross-encoder trainer's groups, schedule, dev selection, time budget and resumable state
(training/ce_train.py), with in-batch plus hard negatives.

Each forward pass holds G groups (a query, its positive and n hard negatives from the bi-encoder's top-k). Every
query is scored against all G * (1 + n) candidates of the pass, one query encoding each and one encoding per
candidate, and the loss is the cross-entropy of its own positive over them (logits = scale * cosine). A candidate
judged relevant to the query, other than the target, is left out of that query's softmax rather than pushed down.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
import torch.nn.functional as F

from sieve.research.mix.runtime import CONFIG_FILE, MixLengths, MixRuntime
from sieve.research.mix.model import MixConfig
from sieve.models.weights import default_model_path
from sieve.training.ce_train import CETrainConfig, CETrainer


@dataclass(frozen=True)
class MixTrainConfig(CETrainConfig):
    contexts: int = 1  # k context embeddings per candidate
    interaction_layers: int = 1  # the encoder's last L layers
    scale: float = 20.0  # logits = scale * cosine
    in_batch: bool = True  # False: each query's softmax covers its own group only


def batch_logits(mix: MixRuntime, batch: list[tuple[str, list[str]]], scale: float) -> torch.Tensor:
    """(G, M) logits of each query of the pass against all M = G * (1 + n) candidates."""
    queries = mix.tokenize_queries([query for query, _ in batch])
    candidates = mix.tokenize_candidates([doc for _, docs in batch for doc in docs])
    return scale * mix.module(queries["input_ids"], queries["attention_mask"], candidates["input_ids"],
                              candidates["attention_mask"])


def excluded(batch: list[tuple[str, list[str]]], relevant: dict[str, set[str]], in_batch: bool) -> torch.Tensor:
    """(G, M) True where a candidate takes no part in a query's softmax: judged relevant to it (other than its
    target, the first of its own group), or, without in-batch negatives, outside its own group."""
    docs = [doc for _, group in batch for doc in group]
    size = len(batch[0][1])
    out = torch.zeros(len(batch), len(docs), dtype=torch.bool)
    for g, (query, _) in enumerate(batch):
        for j, doc in enumerate(docs):
            own = g * size <= j < (g + 1) * size
            out[g, j] = (not in_batch and not own) or (j != g * size and doc in relevant.get(query, ()))
    return out


class MixTrainer(CETrainer):
    def new_model(self, device: torch.device) -> MixRuntime:
        """From --init (a MixEncoder checkpoint to continue, or any encoder directory), else the packaged MiniLM."""
        cfg = self.cfg
        base = Path(cfg.init or default_model_path())
        lengths = MixLengths(cfg.query_max_length, cfg.max_length)
        if (base / CONFIG_FILE).is_file():
            mix = MixRuntime.from_pretrained(base, lengths=lengths, device=device)
            mix.name, mix.weights_hash = Path(cfg.out_dir).name, "unsaved"
            return mix
        mix_cfg = MixConfig(cfg.contexts, cfg.interaction_layers, cfg.scale)
        return MixRuntime.new(base, mix_cfg, name=Path(cfg.out_dir).name, lengths=lengths, device=device)

    def save_best(self) -> None:
        self.ce.save(Path(self.cfg.out_dir))

    @cached_property
    def relevant(self) -> dict[str, set[str]]:
        """Query text -> texts of its judged-relevant documents (every dataset's train split)."""
        out: dict[str, set[str]] = {}
        for ds in self.datasets:
            for i, query in enumerate(ds.train.query_texts):
                out.setdefault(query, set()).update(ds.train.corpus[r].full_text for r in ds.train.positives(i))
        return out

    def batch_loss(self, batch: list[tuple[str, list[str]]]) -> torch.Tensor:
        logits = batch_logits(self.ce, batch, self.ce.module.cfg.scale)  # (G, M)
        mask = excluded(batch, self.relevant, self.cfg.in_batch).to(logits.device)
        targets = torch.arange(len(batch), device=logits.device) * len(batch[0][1])
        return F.cross_entropy(logits.masked_fill(mask, float("-inf")), targets)
