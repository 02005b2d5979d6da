"""Packing work of many requests into forward passes: CMC candidate lists padded with masks, cross-encoder pairs
under a token budget. Plain functions of arrays and tensors; the stages call them from their batched compute."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from sieve.pipeline.state import expired  # noqa: F401 - the stages import it from here


def chunks_under_budget(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices sorted by length (longest first) cut into chunks whose size x longest length stays within
    `budget` (a chunk always holds at least one index)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    chunks, current = [], []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > budget:
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


def chunks_in_order(lengths: Sequence[int], order: Sequence[int], budget: int) -> list[list[int]]:
    """`order` cut into consecutive chunks whose size x longest length stays within `budget` (at least one index
    each): packing that keeps a given order, e.g. request by request so each request finishes early."""
    chunks, current, longest = [], [], 0
    for i in order:
        if current and (len(current) + 1) * max(longest, lengths[i]) > budget:
            chunks.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, lengths[i])
    if current:
        chunks.append(current)
    return chunks


class IndexRows:
    """A candidate list's vectors not read yet: rows of a local index version (index/search_index.py), gathered by
    pad_lists straight into the padded batch, so a request's vectors are copied once (the rows' gather) instead of
    twice (a gather in the request thread, then into the batch)."""

    def __init__(self, index: Any, rows: np.ndarray, store: str | None = None):
        self.index, self.rows, self.store = index, rows, store
        self.shape = (len(rows), index.embedding_dim(store))

    def __len__(self) -> int:
        return len(self.rows)

    def into(self, out: np.ndarray) -> None:
        self.index.embeddings_into(self.rows, out, store=self.store)


def pad_lists(lists: Sequence[np.ndarray | IndexRows], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """B arrays (K_b, ...) or IndexRows -> zero-padded float32 (B, K, ...) and mask (B, K), True for real rows.
    Filled in numpy: torch.zeros of a large tensor fills it on every intra-op thread, and on a busy CPU that parallel
    region cost ~1.4 ms of CPU per (1, 512, 384) list against ~0.02 ms here (same values)."""
    longest = max(len(c) for c in lists)
    padded = np.empty((len(lists), longest, *np.shape(lists[0])[1:]), dtype=np.float32)  # (B, K, ...)
    mask = np.zeros((len(lists), longest), dtype=bool)  # (B, K)
    for b, c in enumerate(lists):  # each row written once: the list, then zeros after it
        if isinstance(c, IndexRows):
            c.into(padded[b, :len(c)])
        else:
            padded[b, :len(c)] = c
        padded[b, len(c):] = 0.0
        mask[b, :len(c)] = True
    return torch.from_numpy(padded).to(device), torch.from_numpy(mask).to(device)


def pad_candidates(queries: Sequence[torch.Tensor], lists: Sequence[np.ndarray | IndexRows],
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """B queries (d,) and B candidate arrays (K_b, d) or IndexRows -> query (B, d), candidates (B, K, d), mask
    (B, K)."""
    cands, mask = pad_lists(lists, device)
    query = torch.stack([q.float().to("cpu") for q in queries])  # (B, d)
    return query.to(device), cands, mask


def trim_to_longest(batch: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    """The given rows of a padded token batch, with the columns that are padding in all of them cut off."""
    idx = torch.as_tensor(rows, device=batch["attention_mask"].device)
    mask = batch["attention_mask"][idx]
    width = int(mask.sum(dim=1).max())
    return {k: v[idx, :width] for k, v in batch.items()}
