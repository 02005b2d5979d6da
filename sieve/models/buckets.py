"""Bucketed shapes (issue 32): a batch is padded up to the next size of a fixed grid, with a mask, so a GPU sees a
few distinct shapes (what CUDA graphs and compiled kernels are keyed on) and the scores do not change.

Grid: powers of two and 1.5x powers of two (1, 2, 3, 4, 6, 8, 12, 16, 24, ...), so padding adds at most half.
Padding rows and columns are masked: a padded token has attention mask 0 (mean pooling and attention skip it), a
padded CMC candidate has mask False (no attention, score -inf), a padded query row is cut off after the forward.
Plain functions of tensors; the caller decides whether to bucket (DeviceRuntime.buckets, models/device.py).
"""
from __future__ import annotations

import torch

MIN_TOKENS = 8  # the shortest token bucket: a query of 3 tokens runs at 8


def bucket(n: int, floor: int = 1, cap: int | None = None) -> int:
    """The smallest grid size >= max(n, floor), but never above `cap` (when n <= cap)."""
    if n < 1:
        raise ValueError(f"a batch dimension must be >= 1, got {n}")
    size, target = 1, max(n, floor)
    while size < target:
        if size >= 2 and size * 3 // 2 >= target and size % 2 == 0:
            size = size * 3 // 2
            break
        size *= 2
    return size if cap is None or n > cap else min(size, cap)


def pad_tokens(batch: dict[str, torch.Tensor], rows: int, width: int, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """A tokenized batch (B, T) -> (rows, width), padded with `pad_id` and attention mask 0."""
    B, T = batch["input_ids"].shape
    assert rows >= B and width >= T, f"cannot pad ({B}, {T}) down to ({rows}, {width})"
    out = {}
    for key, value in batch.items():
        fill = pad_id if key == "input_ids" else 0
        padded = value.new_full((rows, width), fill)  # (rows, width)
        padded[:B, :T] = value
        out[key] = padded
    return out


def bucket_tokens(batch: dict[str, torch.Tensor], max_length: int, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """`batch` padded to its bucketed (batch size, length); the length never past `max_length`."""
    B, T = batch["input_ids"].shape
    return pad_tokens(batch, bucket(B), bucket(T, floor=MIN_TOKENS, cap=max_length), pad_id)


def bucket_cmc(query: torch.Tensor | None, cands: torch.Tensor | None, mask: torch.Tensor,
               evidence: torch.Tensor | None):
    """CMC inputs query (B, d), candidates (B, K, d), mask (B, K), evidence (B, K, F) | None padded to the bucketed
    (B', K'): zero rows, mask False. Cut the scores back with [:B, :K]. Query and candidates None (a CMC that reads
    no vectors, models/cmc.py reads_candidates) stay None."""
    B, K = mask.shape
    rows, width = bucket(B), bucket(K)
    q = c = None
    if cands is not None:
        d = cands.shape[-1]
        q = query.new_zeros(rows, d)  # (B', d)
        q[:B] = query
        c = cands.new_zeros(rows, width, d)  # (B', K', d)
        c[:B, :K] = cands
    m = mask.new_zeros(rows, width)  # (B', K')
    m[:B, :K] = mask
    e = None
    if evidence is not None:
        e = evidence.new_zeros(rows, width, evidence.shape[-1])  # (B', K', F)
        e[:B, :K] = evidence
    return q, c, m, e
