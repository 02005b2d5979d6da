"""Cross-encoder head "cls+cos": score = s_cls + s_cos from one joint forward pass over `[CLS] q [SEP] d [SEP]`.

s_cls is the usual one-logit head on [CLS]. s_cos = scale * cos(mean of the query's last-layer token states,
mean of the document's), with a learned scale (initially 20, the scale all-MiniLM-L6-v2 was trained with).

Why: Sieve trains its cross-encoder from the packaged all-MiniLM-L6-v2, a mean-pooled sentence encoder whose [CLS]
state was never trained to carry meaning. A fresh [CLS] head starts at chance and, on this CPU's budget (~1 pair/s
per core), barely moves: 50 LCE steps left the loss at log 8 (SciFact hold-out nDCG@10 0.18), while s_cos starts
from what the encoder already knows (0.49 before any step, 0.56 after 50; the bi-encoder: 0.64) and is refined by
joint attention over both texts. Both parts are trained with their own LCE loss (the trainer's `parts`) and
summed at inference, so the [CLS] head can still learn what pooling cannot express.

Checkpoint: the Hugging Face classifier directory plus sieve_head.json {"head": "cls+cos"} and head.safetensors
(the fp16 scale); models/ce_heads.py dispatches on it.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from sieve.models.ce_base import HEAD_FILE, HEAD_WEIGHTS, INITIAL_SCALE, SumOfParts, load_classifier, masked_mean, register_head
from sieve.research.heads.late_interaction import segment_masks

HEAD_NAME = "cls+cos"
class CosineScorer(SumOfParts):
    """A sequence-classification transformer (one logit on [CLS]) plus the pooled-cosine part."""

    part_names = ("cls", "cos")

    def __init__(self, classifier: nn.Module, sep_token_id: int, scale: float = INITIAL_SCALE):
        super().__init__()
        self.classifier = classifier
        self.sep_token_id = int(sep_token_id)
        self.scale = nn.Parameter(torch.tensor(float(scale)))

    def parts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(s_cls, s_cos), each (B,)."""
        out = self.classifier(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              output_hidden_states=True)
        states = out.hidden_states[-1]  # (B, T, d)
        q_mask, d_mask = segment_masks(input_ids, attention_mask, self.sep_token_id)
        cos = F.cosine_similarity(masked_mean(states, q_mask), masked_mean(states, d_mask), dim=-1)  # (B,)
        return out.logits[:, 0], self.scale * cos

    def head_spec(self) -> dict:
        """What sieve_head.json holds."""
        return {"head": HEAD_NAME}

    def save_head(self, out_dir: Path, dtype: torch.dtype = torch.float16) -> None:
        out_dir = Path(out_dir)
        (out_dir / HEAD_FILE).write_text(json.dumps(self.head_spec(), indent=2) + "\n", encoding="utf-8")
        save_file({"scale": self.scale.detach().to("cpu", dtype).reshape(1)}, str(out_dir / HEAD_WEIGHTS))

    def load_head(self, path: Path) -> None:
        with torch.no_grad():
            self.scale.copy_(load_file(str(Path(path) / HEAD_WEIGHTS))["scale"].float()[0])


def new_cos(classifier: nn.Module, tokenizer, options: dict) -> CosineScorer:
    """A trainable head around `classifier` (the registry entry "cls+cos" of models/ce_heads.py)."""
    return CosineScorer(classifier, tokenizer.sep_token_id, float(options.get("scale", INITIAL_SCALE)))


def load_cos(path: Path, spec: dict, tokenizer) -> CosineScorer:
    scorer = new_cos(load_classifier(path), tokenizer, {})
    scorer.load_head(path)
    return scorer


register_head("cls+cos", new_cos, load_cos)
