"""CMC, "Comparing Multiple Candidates" (Song et al. 2024): the query vector and K candidate vectors attend to
each other in two shallow transformer-encoder layers (no positional encoding: the candidate set is a set), and
candidate j scores <q', c'_j>. Pure module: vectors in, scores out; towers, devices and batching live outside.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("shared", "separate")


@dataclass(frozen=True)
class CMCConfig:
    mode: str = "shared"  # shared: candidates are the bi-encoder's document vectors; separate: own candidate tower
    dim: int = 384
    n_layers: int = 2
    n_heads: int = 6
    ffn_mult: int = 4
    dropout: float = 0.1
    evidence: int = 0  # per-candidate first-stage features (pipeline/evidence.py); 0 = the paper's CMC
    evidence_hidden: int = 0  # > 0: a hidden layer of this width scores the features too (a non-linear fusion)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"CMC mode {self.mode!r} is not one of {MODES}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


class CMCLayer(nn.Module):
    """A post-LN transformer-encoder layer F (as nn.TransformerEncoderLayer) wrapped in the paper's extra skip,
    y = x + g * F(x). The gate g starts at zero so an untrained layer is the identity (ReZero-style): enabling
    an untrained CMC ranks exactly as the bi-encoder does.
    """

    def __init__(self, cfg: CMCConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.dim)
        self.ff_in = nn.Linear(cfg.dim, cfg.ffn_mult * cfg.dim)
        self.ff_out = nn.Linear(cfg.ffn_mult * cfg.dim, cfg.dim)
        self.norm_attn = nn.LayerNorm(cfg.dim)
        self.norm_ff = nn.LayerNorm(cfg.dim)
        self.dropout = nn.Dropout(cfg.dropout)
        self.gate = nn.Parameter(torch.zeros(cfg.dim))  # extra skip connection, identity at init

    def attention(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        B, L, d = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, hd)
        p = self.dropout.p if self.training else 0.0
        # memory-efficient kernel: never materialises the (L, L) matrix, so K = 16,384 fits in RAM
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)  # (B, H, L, hd)
        return self.out(a.transpose(1, 2).reshape(B, L, d))  # (B, L, d)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm_attn(x + self.dropout(self.attention(x, attn_mask)))  # (B, L, d)
        h = self.norm_ff(h + self.dropout(self.ff_out(self.dropout(F.gelu(self.ff_in(h))))))
        return x + self.gate * h


class Evidence(nn.Module):
    """What CMC adds when candidates arrive with first-stage evidence (beyond the paper): feature 0 is the
    first-stage prior (higher = ranked higher), the rest are scores and ranks from each retriever.

    The features are embedded and added to the candidate vectors, and the score is
        prior_weight * prior + <w, features> + cmc_weight * <q', c'>.
    Every new parameter starts at zero except prior_weight (1), so an untrained model ranks exactly as the first
    stage did; training learns a fusion of the features and how much the attention layers may move it."""

    def __init__(self, cfg: CMCConfig):
        super().__init__()
        self.embed = nn.Linear(cfg.evidence, cfg.dim)
        self.linear = nn.Linear(cfg.evidence, 1)
        for layer in (self.embed, self.linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.prior_weight = nn.Parameter(torch.ones(()))
        self.cmc_weight = nn.Parameter(torch.zeros(()))
        self.mlp = None
        if cfg.evidence_hidden:
            self.mlp = nn.Sequential(nn.Linear(cfg.evidence, cfg.evidence_hidden), nn.GELU(),
                                     nn.Linear(cfg.evidence_hidden, 1))
            nn.init.zeros_(self.mlp[2].weight)  # zero output at start: identity still
            nn.init.zeros_(self.mlp[2].bias)

    def score(self, features: torch.Tensor, interaction: torch.Tensor) -> torch.Tensor:
        """features (B, K, F), interaction <q', c'> (B, K) -> (B, K)."""
        score = self.prior_weight * features[..., 0] + self.linear(features).squeeze(-1) + self.cmc_weight * interaction
        return score if self.mlp is None else score + self.mlp(features).squeeze(-1)


class CMC(nn.Module):
    """Scores candidates in the context of each other. Pure tensor function."""

    def __init__(self, cfg: CMCConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(CMCLayer(cfg) for _ in range(cfg.n_layers))
        self.evidence = Evidence(cfg) if cfg.evidence else None

    def reads_candidates(self) -> bool:
        """False for a model whose scores do not depend on the query and candidate vectors at all: no attention
        layers, and evidence whose interaction term <q, c + embed(features)> has weight exactly 0 (the shipped
        cmc-fusion-mlp), i.e. an MLP over the first-stage evidence. forward() then takes query and candidates as
        None, and nothing needs to gather, pad or move (B, K, d) vectors for it. Reads a weight: call it once."""
        return bool(self.layers) or self.evidence is None or float(self.evidence.cmc_weight.detach()) != 0.0

    def forward(self, query: torch.Tensor | None, candidates: torch.Tensor | None, mask: torch.Tensor | None = None,
                features: torch.Tensor | None = None) -> torch.Tensor:
        """query (B, d), candidates (B, K, d), mask (B, K) True for real candidates, features (B, K, F) when the
        model takes evidence (cfg.evidence = F) -> scores (B, K). Where reads_candidates() is False, query and
        candidates may be None: the same scores from the features alone (the interaction term is 0 either way).

        Padded candidates get -inf and take no part in attention, so one batch holds queries with different K.
        """
        if candidates is None:
            assert not self.layers and self.evidence is not None, "this CMC reads its candidates' vectors"
            scores = self.evidence.score(features, features.new_zeros(features.shape[:2]))  # (B, K)
            return scores if mask is None else scores.masked_fill(~mask, float("-inf"))
        B, K, d = candidates.shape
        assert query.shape == (B, d), f"query {tuple(query.shape)} does not match candidates {tuple(candidates.shape)}"
        if self.evidence is not None:
            assert features is not None and features.shape == (B, K, self.cfg.evidence), \
                f"this CMC takes {self.cfg.evidence} evidence features per candidate"
            candidates = candidates + self.evidence.embed(features)
        x = torch.cat([query.unsqueeze(1), candidates], dim=1)  # (B, 1+K, d)
        attn_mask = None
        if mask is not None and not bool(mask.all()):
            assert mask.shape == (B, K), f"mask {tuple(mask.shape)} != {(B, K)}"
            keep = torch.cat([mask.new_ones(B, 1), mask], dim=1)  # (B, 1+K); the query is never padding
            attn_mask = keep[:, None, None, :]  # (B, 1, 1, 1+K) broadcast over heads and query positions
        for layer in self.layers:
            x = layer(x, attn_mask)
        scores = torch.einsum("bd,bkd->bk", x[:, 0], x[:, 1:])  # (B, K)
        if self.evidence is not None:
            scores = self.evidence.score(features, scores)
        if attn_mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores


def randomize_gates(model: CMC, scale: float = 0.5, seed: int = 0) -> CMC:
    """Give an untrained model non-trivial layers (tests of the invariants need a model that is not the identity)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.layers:
            layer.gate.copy_(torch.rand(layer.gate.shape, generator=generator) * scale)
    return model
