"""Cross-encoder with contextualised late interaction (Zhang, Li, Lin 2023): score = s_cls + s_late.

s_cls is the usual one-logit head on [CLS]. s_late reuses the same forward pass: the last-layer token vectors of
the pair `[CLS] query [SEP] document [SEP]` are projected (to 128 dimensions by default, or left as they are),
L2-normalised as in ColBERT, and s_late = sum over query tokens of the max over document tokens of their dot
product. Special tokens and padding take part in neither side. Both heads are trained with their own LCE loss
(losses added) and summed at inference; the extra cost is one (T x T) similarity per pair.

LateInteractionScorer is the pure module (token ids in, scores out): `parts` returns both heads for the trainer,
`forward` their sum, the call every cross-encoder head shares (models/ce_heads.py). Checkpoint: the Hugging Face
classifier directory plus sieve_head.json {"head": "cls+late", "dim", "normalize"} and head.safetensors (the fp16
projection); models/ce_heads.py dispatches on it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from sieve.models.ce_base import HEAD_FILE, HEAD_WEIGHTS, SumOfParts, load_classifier, register_head

HEAD_NAME = "cls+late"


@dataclass(frozen=True)
class LateConfig:
    dim: int | None = 128  # projection size; None = the encoder's hidden vectors, unprojected
    normalize: bool = True  # cosine token similarities (ColBERT); False = raw dot products


def segment_masks(input_ids: torch.Tensor, attention_mask: torch.Tensor, sep_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) bool masks of the query and the document tokens of `[CLS] q [SEP] d [SEP] [PAD]...`: query tokens
    lie before the first [SEP], document tokens between the first and the second."""
    sep = input_ids == sep_id  # (B, T)
    seps_before = sep.long().cumsum(dim=1) - sep.long()  # [SEP]s strictly before each position
    real = attention_mask.bool() & ~sep
    not_first = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :] > 0  # position 0 is [CLS]
    return real & (seps_before == 0) & not_first, real & (seps_before == 1)


def maxsim(q: torch.Tensor, q_mask: torch.Tensor, d: torch.Tensor, d_mask: torch.Tensor) -> torch.Tensor:
    """sum_i max_j <q_i, d_j> over real query tokens i and real document tokens j: (B,).

    q (B, Tq, p), d (B, Td, p), masks (B, Tq) / (B, Td) bool. A pair without document tokens scores 0."""
    assert q.dim() == 3 and d.dim() == 3 and q.shape[0] == d.shape[0] and q.shape[2] == d.shape[2], (q.shape, d.shape)
    assert q_mask.shape == q.shape[:2] and d_mask.shape == d.shape[:2], (q_mask.shape, d_mask.shape)
    sim = torch.einsum("bip,bjp->bij", q, d)  # (B, Tq, Td)
    sim = sim.masked_fill(~d_mask[:, None, :], torch.finfo(sim.dtype).min)
    best = sim.max(dim=-1).values  # (B, Tq)
    keep = q_mask & d_mask.any(dim=-1, keepdim=True)
    return torch.where(keep, best, torch.zeros_like(best)).sum(dim=-1)


def token_projection(hidden: int, cfg: LateConfig) -> nn.Module:
    """The per-token projection of a late-interaction head (none when cfg.dim is None)."""
    return nn.Linear(hidden, cfg.dim, bias=False) if cfg.dim else nn.Identity()


def token_vectors(proj: nn.Module, states: torch.Tensor, cfg: LateConfig) -> torch.Tensor:
    """(B, T, d) last-layer states -> (B, T, p) token vectors that maxsim compares (unit length if cfg.normalize)."""
    vectors = proj(states)
    return F.normalize(vectors, dim=-1) if cfg.normalize else vectors


def load_projection(proj: nn.Module, saved: dict[str, torch.Tensor], cfg: LateConfig) -> None:
    """Loads the `proj.*` tensors of a head.safetensors into `proj` (nothing to load for an unprojected head)."""
    if cfg.dim:
        proj.load_state_dict({k.removeprefix("proj."): v.float() for k, v in saved.items() if k.startswith("proj.")})


class LateInteractionScorer(SumOfParts):
    """A sequence-classification transformer (one logit) plus a token projection for the late-interaction head."""

    part_names = ("cls", "late")

    def __init__(self, classifier: nn.Module, sep_token_id: int, cfg: LateConfig = LateConfig()):
        super().__init__()
        self.classifier = classifier
        self.cfg = cfg
        self.sep_token_id = int(sep_token_id)
        self.proj = token_projection(int(classifier.config.hidden_size), cfg)

    def parts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(s_cls, s_late), each (B,)."""
        out = self.classifier(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              output_hidden_states=True)
        vectors = token_vectors(self.proj, out.hidden_states[-1], self.cfg)  # (B, T, p)
        q_mask, d_mask = segment_masks(input_ids, attention_mask, self.sep_token_id)
        return out.logits[:, 0], maxsim(vectors, q_mask, vectors, d_mask)

    # -- checkpoint side: sieve_head.json + head.safetensors beside the Hugging Face directory ---------------------
    def head_spec(self) -> dict:
        return {"head": HEAD_NAME, **asdict(self.cfg)}

    def save_head(self, out_dir: Path, dtype: torch.dtype = torch.float16) -> None:
        out_dir = Path(out_dir)
        (out_dir / HEAD_FILE).write_text(json.dumps(self.head_spec(), indent=2) + "\n", encoding="utf-8")
        weights = {f"proj.{k}": v.detach().to("cpu", dtype).contiguous() for k, v in self.proj.state_dict().items()}
        if weights:  # an unprojected head has no weights of its own
            save_file(weights, str(out_dir / HEAD_WEIGHTS))

    def load_head(self, path: Path) -> None:
        if self.cfg.dim:
            load_projection(self.proj, load_file(str(Path(path) / HEAD_WEIGHTS)), self.cfg)


def config_from_spec(spec: dict) -> LateConfig:
    dim = spec.get("dim", LateConfig.dim)
    return LateConfig(dim=int(dim) if dim else None, normalize=bool(spec.get("normalize", True)))


def new_late(classifier: nn.Module, tokenizer, options: dict) -> LateInteractionScorer:
    """A trainable head around `classifier` (the registry entry "cls+late" of models/ce_heads.py); the projection is
    drawn from torch's seed. options: {"dim": int | None, "normalize": bool}."""
    return LateInteractionScorer(classifier, tokenizer.sep_token_id, config_from_spec(options))


def load_late(path: Path, spec: dict, tokenizer) -> LateInteractionScorer:
    scorer = new_late(load_classifier(path), tokenizer, spec)
    scorer.load_head(path)
    return scorer


register_head("cls+late", new_late, load_late)
