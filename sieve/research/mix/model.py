"""MixEncoder (Yang et al. 2023, "Once is Enough: A Lightweight Cross-Attention for Fast Sentence Pair Modeling").

Offline, each candidate is encoded once as `[CLS] [CTX_1..CTX_k] text [SEP]`; the last-layer states of its k
context tokens are its context embeddings (k, d), stored beside the index.

Online, the query is encoded once, by an ordinary forward pass. The encoder's last L layers are the interaction
layers: at layer l, each candidate's context embeddings go through that same layer (same weights) with attention
over [their own keys and values; the query tokens' keys and values from the query's layer-l input]. The query never
attends to a candidate and candidates never see each other, so N candidates are N independent rows: one query
encoding whatever N, and permuting the candidates permutes the scores.

Query state: after each interaction layer, the candidate's mean context embedding (through a learned projection,
initialised to the identity) attends over the query's layer output; that candidate-aware summary a is gated into
the state s (starting at 0): s <- g * s + (1 - g) * a, g = sigmoid(W [s; a] + b). Score = cos(mean_k E, s).

Pure module: tensors in, tensors out; tokenisation, batching and checkpoints live in models/mix_runtime.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MixConfig:
    contexts: int = 1  # k: context embeddings per candidate
    interaction_layers: int = 1  # L: the encoder's last L layers
    scale: float = 20.0  # training logits = scale * cosine (a softmax temperature of 0.05)


class QueryStates(NamedTuple):
    """What the interaction layers need from the one query encoding."""

    inputs: tuple[torch.Tensor, ...]  # each interaction layer's input hidden states, (B, T, d)
    outputs: tuple[torch.Tensor, ...]  # and its output hidden states, (B, T, d)
    mask: torch.Tensor  # (B, T) bool, real query tokens


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(..., n, d) -> (..., heads, n, d / heads)."""
    *lead, n, d = x.shape
    return x.view(*lead, n, heads, d // heads).transpose(-3, -2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(..., heads, n, dh) -> (..., n, heads * dh)."""
    *lead, h, n, dh = x.shape
    return x.transpose(-3, -2).reshape(*lead, n, h * dh)


def masked_scores(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention scores (B, M, h, k, T) with padded query tokens (mask (B, T) False) at -inf."""
    return scores.masked_fill(~mask[:, None, None, None, :], float("-inf"))


class MixEncoder(nn.Module):
    def __init__(self, encoder: nn.Module, cfg: MixConfig = MixConfig()):
        super().__init__()
        n_layers = int(encoder.config.num_hidden_layers)
        if not 1 <= cfg.interaction_layers <= n_layers:
            raise ValueError(f"interaction_layers must be in 1..{n_layers}, got {cfg.interaction_layers}")
        if cfg.contexts < 1:
            raise ValueError(f"contexts must be >= 1, got {cfg.contexts}")
        self.encoder = encoder  # a BERT-style encoder (encoder.encoder.layer[i] are its transformer layers)
        self.cfg = cfg
        self.first = n_layers - cfg.interaction_layers
        d = int(encoder.config.hidden_size)
        self.heads = int(encoder.config.num_attention_heads)
        self.compress = nn.ModuleList(nn.Linear(d, d) for _ in range(cfg.interaction_layers))
        self.gates = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(cfg.interaction_layers))
        for proj in self.compress:  # start as a plain similarity between the candidate and each query token
            nn.init.eye_(proj.weight)
            nn.init.zeros_(proj.bias)

    @property
    def dim(self) -> int:
        return int(self.encoder.config.hidden_size)

    def interaction_layer(self, i: int) -> nn.Module:
        return self.encoder.encoder.layer[self.first + i]

    # -- the two encodings ---------------------------------------------------------------------------------------
    def encode_candidates(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """`[CLS] [CTX_1..k] text [SEP]` ids -> (M, k, d) context embeddings."""
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (M, T, d)
        return states[:, 1:1 + self.cfg.contexts]

    def encode_query(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> QueryStates:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        hidden = out.hidden_states  # n_layers + 1 tensors (B, T, d): the embeddings, then each layer's output
        n = len(hidden) - 1
        return QueryStates(tuple(hidden[self.first:n]), tuple(hidden[self.first + 1:n + 1]), attention_mask.bool())

    # -- interaction ---------------------------------------------------------------------------------------------
    def context_layer(self, i: int, contexts: torch.Tensor, query_in: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Interaction layer i on the context embeddings (B|1, M, k, d), attending over [own; query tokens]."""
        layer, k = self.interaction_layer(i), contexts.shape[-2]
        sa = layer.attention.self
        q = split_heads(sa.query(contexts), self.heads)  # (B|1, M, h, k, dh)
        own_k, own_v = split_heads(sa.key(contexts), self.heads), split_heads(sa.value(contexts), self.heads)
        query_k = split_heads(sa.key(query_in), self.heads)[:, None]  # (B, 1, h, T, dh)
        query_v = split_heads(sa.value(query_in), self.heads)[:, None]  # (B, 1, h, T, dh)
        scale = 1.0 / math.sqrt(q.shape[-1])
        own = q @ own_k.transpose(-1, -2) * scale  # (B|1, M, h, k, k)
        cross = masked_scores(q @ query_k.transpose(-1, -2) * scale, mask)  # (B, M, h, k, T)
        own = own.expand(*cross.shape[:-1], k)
        probs = sa.dropout(torch.softmax(torch.cat([own, cross], dim=-1), dim=-1))  # (B, M, h, k, k + T)
        mixed = probs[..., :k] @ own_v + probs[..., k:] @ query_v  # (B, M, h, k, dh)
        attended = layer.attention.output(merge_heads(mixed), contexts)  # dense, dropout, LayerNorm(x + residual)
        return layer.output(layer.intermediate(attended), attended)  # (B, M, k, d)

    def summarize(self, i: int, contexts: torch.Tensor, query_out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Candidate-aware summary of the query's layer output: (B, M, d)."""
        probe = split_heads(self.compress[i](contexts.mean(dim=-2))[..., None, :], self.heads)  # (B, M, h, 1, dh)
        tokens = split_heads(query_out, self.heads)[:, None]  # (B, 1, h, T, dh)
        scores = masked_scores(probe @ tokens.transpose(-1, -2) / math.sqrt(probe.shape[-1]), mask)  # (B, M, h, 1, T)
        return merge_heads(torch.softmax(scores, dim=-1) @ tokens)[..., 0, :]  # (B, M, d)

    def interact(self, query: QueryStates, contexts: torch.Tensor) -> torch.Tensor:
        """contexts (M, k, d) shared by every query, or (B, M, k, d) per query -> (B, M) cosine scores."""
        if contexts.dim() == 3:
            contexts = contexts[None]  # (1, M, k, d)
        assert contexts.dim() == 4 and contexts.shape[-1] == self.dim, contexts.shape
        B = query.mask.shape[0]
        state = contexts.new_zeros(B, contexts.shape[1], self.dim)  # (B, M, d)
        for i, (query_in, query_out) in enumerate(zip(query.inputs, query.outputs)):
            contexts = self.context_layer(i, contexts, query_in, query.mask)  # (B, M, k, d)
            summary = self.summarize(i, contexts, query_out, query.mask)  # (B, M, d)
            gate = torch.sigmoid(self.gates[i](torch.cat([state, summary], dim=-1)))
            state = gate * state + (1 - gate) * summary
        return F.cosine_similarity(contexts.mean(dim=-2), state, dim=-1)  # (B, M)

    def forward(self, query_ids: torch.Tensor, query_mask: torch.Tensor, cand_ids: torch.Tensor,
                cand_mask: torch.Tensor) -> torch.Tensor:
        """Every query against every candidate (in-batch training): (B, M) cosine scores."""
        return self.interact(self.encode_query(query_ids, query_mask), self.encode_candidates(cand_ids, cand_mask))
