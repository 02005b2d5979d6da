"""benchmarks/feedback_memory_oracle.py's rank correlation (the figure RESULTS.md quotes): ties share their mean rank."""
from __future__ import annotations

import numpy as np

from benchmarks.feedback_memory_oracle import spearman


def test_rank_correlation_with_ties():
    x = [0.3, 0.1, 0.1, 0.7, 0.0]
    assert abs(spearman(x, [v ** 3 + 5 for v in x]) - 1.0) < 1e-12  # any increasing transform
    assert abs(spearman(x, [-v for v in x]) + 1.0) < 1e-12
    # by hand: ranks of x with the tie averaged: 3, 1.5, 1.5, 4, 0; of y: 0, 1, 2, 3, 4
    rx, ry = np.array([3, 1.5, 1.5, 4, 0]), np.arange(5.0)
    want = np.corrcoef(rx, ry)[0, 1]
    assert abs(spearman(x, [0, 1, 2, 3, 4]) - want) < 1e-12
