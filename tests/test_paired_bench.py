"""benchmarks/paired_cmc.py: the paired comparison of two rankers' per-query nDCG@10."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.paired_cmc import paired


def test_paired_counts_wins_and_brackets_the_mean():
    a = np.array([0.5, 0.5, 0.5, 0.5, 0.2, 0.9])
    b = np.array([0.6, 0.5, 0.4, 0.7, 0.2, 0.9])  # +0.1, 0, -0.1, +0.2, 0, 0
    got = paired(a, b, rounds=2000)
    assert got["b_minus_a"] == pytest.approx(0.2 / 6, abs=1e-4)
    assert (got["b_wins"], got["b_loses"], got["queries"]) == (2, 1, 6)
    low, high = got["ci95"]
    assert low < got["b_minus_a"] < high and low < 0 < high  # a mixed result is not called a gain


def test_a_consistent_gain_has_an_interval_above_zero():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 0.8, 200)
    got = paired(a, a + rng.uniform(0.01, 0.05, 200))
    assert got["ci95"][0] > 0 and got["b_wins"] == 200
    assert paired(a, a)["ci95"] == [0.0, 0.0]
