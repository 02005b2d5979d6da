"""Bi-encoder: a Hugging Face transformer, mean-pooled and L2-normalised (how all-MiniLM-L6-v2 was trained)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mean_pool(token_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the non-padding token vectors."""
    mask = attention_mask.unsqueeze(-1).to(token_states.dtype)  # (B, T, 1)
    summed = (token_states * mask).sum(dim=1)  # (B, d)
    return summed / mask.sum(dim=1).clamp(min=1e-9)


class SentenceEncoder(nn.Module):
    """Pure module: token ids in, one unit vector per text out."""

    def __init__(self, transformer: nn.Module, normalize: bool = True):
        super().__init__()
        self.transformer = transformer
        self.normalize = normalize

    @property
    def dim(self) -> int:
        return int(self.transformer.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, d)
        pooled = mean_pool(states, attention_mask)  # (B, d)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled
