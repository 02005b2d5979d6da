"""Cross-encoder head "gated+late": the gated cross-encoder (models/ce_gated.py) plus contextualised late
interaction (Zhang, Li, Lin 2023) on the same forward pass.

score = s_cls + s_cos + s_late. s_cls and s_cos are the gated head's own parts; s_late = w * sum over query tokens
of the max over document tokens of the cosine of their projected last-layer states (projection to 128 dimensions by
default, or none), special tokens and padding excluded on both sides. w is a learned weight that starts at 0, so a
fresh head scores exactly as a fresh gated head (the bi-encoder's cosine x scale) and the late part joins as it
learns; every part is trained with its own LCE loss (losses added), and the parts are summed at inference.

Why on the gated body and not on the plain `[CLS] q [SEP] d [SEP]` one (models/late_interaction.py, head cls+late):
that body starts at chance and did not get past the bi-encoder on this 2-core CPU; the gated one starts at the
bi-encoder. With and without late interaction is then "gated+late" against "gated", trained by the same command.

Checkpoint: the Hugging Face classifier directory plus sieve_head.json {"head": "gated+late", "dim", "normalize"}
and head.safetensors (fp16 scale, gates, late weight and projection); models/ce_heads.py dispatches on it.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from sieve.models.ce_base import HEAD_WEIGHTS, INITIAL_SCALE, load_classifier, register_head
from sieve.models.ce_gated import GatedScorer, zero_classifier
from sieve.research.heads.late_interaction import (LateConfig, config_from_spec, load_projection, maxsim, token_projection,
                                     token_vectors)

HEAD_NAME = "gated+late"


def content_masks(input_ids: torch.Tensor, attention_mask: torch.Tensor, segments: torch.Tensor,
                  special_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) bool masks of the query's and the document's own tokens in `[CLS] q [SEP] [CLS] d [SEP] [PAD]...`:
    real tokens of segment 0 / 1 that are not special tokens."""
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    for token in special_ids:
        special |= input_ids == token
    content = attention_mask.bool() & ~special
    return content & (segments == 0), content & (segments == 1)


class GatedLateScorer(GatedScorer):
    """Pure module: segment-laid-out pair ids in (GatedScorer.pair_inputs), one score per pair out."""

    part_names = ("cls", "cos", "late")

    def __init__(self, classifier: nn.Module, special_ids: tuple[int, ...], cfg: LateConfig = LateConfig(),
                 scale: float = INITIAL_SCALE):
        super().__init__(classifier, scale)
        self.cfg = cfg
        self.special_ids = tuple(int(t) for t in special_ids)
        self.proj = token_projection(int(classifier.config.hidden_size), cfg)
        self.late_weight = nn.Parameter(torch.zeros(()))

    def head_parameters(self) -> list[nn.Parameter]:
        return [*super().head_parameters(), self.late_weight, *self.proj.parameters()]

    def parts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(s_cls, s_cos, s_late), each (B,)."""
        if token_type_ids is None:
            raise ValueError("the gated+late head needs segment ids (token_type_ids) from its pair_inputs()")
        states = self.states(input_ids, attention_mask, token_type_ids)
        s_cls, s_cos = self.score_states(states, attention_mask, token_type_ids)
        vectors = token_vectors(self.proj, states, self.cfg)  # (B, T, p)
        q_mask, d_mask = content_masks(input_ids, attention_mask, token_type_ids, self.special_ids)
        return s_cls, s_cos, self.late_weight * maxsim(vectors, q_mask, vectors, d_mask)

    def head_spec(self) -> dict:
        return {"head": HEAD_NAME, **asdict(self.cfg)}

    def head_tensors(self) -> dict[str, torch.Tensor]:
        extra = {"late_weight": self.late_weight.reshape(1)}
        extra.update({f"proj.{k}": v for k, v in self.proj.state_dict().items()})
        return {**super().head_tensors(), **extra}

    def load_head(self, path: Path) -> None:
        saved = load_file(str(Path(path) / HEAD_WEIGHTS))
        super().load_head(path)
        with torch.no_grad():
            self.late_weight.copy_(saved["late_weight"].float()[0])
        load_projection(self.proj, saved, self.cfg)


def special_ids(tokenizer) -> tuple[int, ...]:
    return tuple(t for t in (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id) if t is not None)


def new_gated_late(classifier: nn.Module, tokenizer, options: dict) -> GatedLateScorer:
    """A fresh head: gates closed, [CLS] logit and late weight zeroed (the first scores are the bi-encoder's x scale);
    the projection is drawn from torch's seed. options: {"dim": int | None, "normalize": bool}."""
    zero_classifier(classifier)
    return GatedLateScorer(classifier, special_ids(tokenizer), config_from_spec(options))


def load_gated_late(path: Path, spec: dict, tokenizer) -> GatedLateScorer:
    scorer = GatedLateScorer(load_classifier(path), special_ids(tokenizer), config_from_spec(spec))
    scorer.load_head(path)
    return scorer


register_head("gated+late", new_gated_late, load_gated_late)
