"""Cross-encoder variants ("heads"): what every head shares, and how a checkpoint directory says which one it holds.

A cross-encoder checkpoint is a Hugging Face sequence-classification directory (config.json, model.safetensors,
tokenizer files). A variant adds `sieve_head.json` = {"head": name, ...its own fields} and, for extra weights,
`head.safetensors` (fp16, safetensors only). No sieve_head.json means "cls", so plain checkpoints keep loading.

Every head is a pure module holding the classifier as `.classifier`, with PairScorer's call,
forward(input_ids, attention_mask, token_type_ids=None) -> (B,) scores, so CrossEncoder.score, the trainer's group
logits and LCE work unchanged for all of them. A head may add `parts(...)` (scores its losses train separately) and
`save_head(dir)` (its extra files), `pair_inputs(tokenizer, query_ids, doc_ids, max_length)` (its own pair layout
instead of `[CLS] q [SEP] d [SEP]`) and `head_parameters()` (trained with the trainer's head learning rate).

HEADS: name -> Head(new, load), filled by `register_head`: "cls" here, "gated" by sieve/models/ce_gated.py (both
served by the core), the research heads (emb, cls+late, cls+cos, gated+late) by sieve.research.heads, a plugin
(sieve/plugins.py) loaded when a checkpoint names a head not registered yet. new(classifier, tokenizer, options)
builds a fresh head around a loaded classifier (training; it may add tokens to the tokenizer); load(path, spec,
tokenizer) rebuilds a saved one. This module imports no head.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from sieve import plugins

HEAD_FILE = "sieve_head.json"
HEAD_WEIGHTS = "head.safetensors"
INITIAL_SCALE = 20.0  # the starting temperature of a head's cosine part (cls+cos, gated)


class Head(NamedTuple):
    new: Callable[[nn.Module, object, dict], nn.Module]
    load: Callable[[Path, dict, object], nn.Module]


HEADS: dict[str, Head] = {}


def register_head(name: str, new: Callable, load: Callable) -> None:
    HEADS[name] = Head(new, load)


class PairScorer(nn.Module):
    """Pure module: pair token ids in, one relevance logit per pair out (the "cls" head)."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.classifier(input_ids=input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids).logits  # (B, num_labels)
        return logits[:, 0]  # (B,)


@dataclass(frozen=True)
class PairLengths:
    query_max_length: int = 64
    max_length: int = 512


class SumOfParts(nn.Module):
    """Base of the heads whose score is the sum of separately trained parts: a subclass defines parts(...) and
    names them, in order, in `part_names`."""

    part_names: tuple[str, ...] = ()

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return sum(self.parts(input_ids, attention_mask, token_type_ids))  # (B,)


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """states (B, T, d), mask (B, T) bool -> (B, d) mean of the masked-in vectors (0 where a row has none)."""
    weights = mask.unsqueeze(-1).to(states.dtype)  # (B, T, 1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., d), (..., d) -> (...) cosine similarity as normalised vectors' inner product: F.cosine_similarity's value
    (1e-7) in operations OpenVINO converts (it has no rule for aten::cosine_similarity; models/openvino_scorer.py)."""
    return (F.normalize(a, dim=-1, eps=1e-8) * F.normalize(b, dim=-1, eps=1e-8)).sum(dim=-1)


def load_classifier(path: str | Path) -> nn.Module:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1, local_files_only=True)


def new_cls(classifier: nn.Module, tokenizer, options: dict) -> nn.Module:
    return PairScorer(classifier)


def load_cls(path: Path, spec: dict, tokenizer) -> nn.Module:
    return new_cls(load_classifier(path), tokenizer, spec)


register_head("cls", new_cls, load_cls)


def check_head_name(name, where: str) -> None:
    if name not in HEADS:
        plugins.load_plugins()  # a research or third-party head registers itself when its plugin is imported
    if name not in HEADS:
        raise ValueError(f"{where} names the cross-encoder head {name!r}; Sieve knows {', '.join(HEADS)}")


def read_head(path: str | Path) -> dict:
    """The checkpoint's sieve_head.json ({"head": "cls"} when there is none); an unknown head is refused."""
    file = Path(path) / HEAD_FILE
    if not file.is_file():
        return {"head": "cls"}
    spec = json.loads(file.read_text(encoding="utf-8"))
    check_head_name(spec.get("head"), str(file))
    return spec


def load_head(path: str | Path, tokenizer) -> nn.Module:
    """The scoring module of the checkpoint at `path`, whichever head it holds."""
    spec = read_head(path)
    return HEADS[spec["head"]].load(Path(path), spec, tokenizer)


def new_head(name: str, classifier: nn.Module, tokenizer, options: dict | None = None) -> nn.Module:
    check_head_name(name, "the training config")
    return HEADS[name].new(classifier, tokenizer, options or {})


def trained_lengths(path: str | Path) -> PairLengths:
    """The pair lengths recorded in the checkpoint's sieve_head.json by `sieve train ce` (its training lengths),
    else PairLengths' defaults (64 / 512)."""
    spec, default = read_head(path), PairLengths()
    return PairLengths(int(spec.get("query_max_length", default.query_max_length)),
                       int(spec.get("max_length", default.max_length)))


def record_lengths(path: str | Path, lengths) -> None:
    """Adds the pair lengths to the checkpoint's sieve_head.json (written as {"head": "cls"} where there is none)."""
    spec = read_head(path)
    spec.update(query_max_length=lengths.query_max_length, max_length=lengths.max_length)
    (Path(path) / HEAD_FILE).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")


def head_hash(path: str | Path, weights_hash: str) -> str:
    """The body's weights hash, extended with the head's own files when there are any (two heads on one body
    differ); a plain checkpoint keeps its plain weights hash."""
    extra = [Path(path) / name for name in (HEAD_FILE, HEAD_WEIGHTS) if (Path(path) / name).is_file()]
    if not extra:
        return weights_hash
    digest = hashlib.sha256(weights_hash.encode())
    for file in extra:
        digest.update(file.read_bytes())
    return digest.hexdigest()
