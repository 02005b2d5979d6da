"""pad_lists (pipeline/packing.py): each list's rows, then zeros, never what the memory held before (the padded
array is not zero-filled up front: each row is written once)."""
from __future__ import annotations

import numpy as np
import torch

from sieve.pipeline.packing import pad_lists


def test_rows_then_zeros_whatever_the_memory_held():
    cpu = torch.device("cpu")
    rng = np.random.default_rng(0)
    for _ in range(20):
        full = [np.full((40, 6), 7.0, dtype=np.float32) for _ in range(3)]
        padded, _ = pad_lists(full, cpu)  # leaves 7.0 in memory the next call is likely to get back
        del padded
        lists = [rng.standard_normal((n, 6)).astype(np.float32) for n in (40, 3, 0)]
        padded, mask = pad_lists(lists, cpu)
        assert padded.shape == (3, 40, 6) and mask.shape == (3, 40)
        for b, rows in enumerate(lists):
            assert np.array_equal(padded[b, :len(rows)].numpy(), rows)
            assert not padded[b, len(rows):].numpy().any()
            assert mask[b].tolist() == [True] * len(rows) + [False] * (40 - len(rows))
