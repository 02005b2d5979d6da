"""Position-bias estimation recovers a known position-based click model from synthetic logs with randomised
adjacent swaps; without swaps it falls back to the stated default (1/rank)^eta."""
from __future__ import annotations

import numpy as np

from sieve.feedback import propensity


def synthetic_logs(n: int, true_p: np.ndarray, swap_fraction: float, depth: int, seed: int = 0):
    """Answers of 10 results; each result relevant with a probability that falls with its original rank (as a ranker's
    would); clicked when examined (true_p at its displayed rank) and relevant (p+ 0.9, p- 0.05)."""
    rng = np.random.default_rng(seed)
    relevant_at = np.linspace(0.6, 0.1, 10)
    logs = []
    for _ in range(n):
        relevant = rng.random(10) < relevant_at
        swap = int(rng.integers(1, depth)) if rng.random() < swap_fraction else None
        order = np.arange(10)
        if swap is not None:
            order[[swap - 1, swap]] = order[[swap, swap - 1]]
        shown_relevant = relevant[order]
        click_p = true_p[:10] * np.where(shown_relevant, 0.9, 0.05)
        clicked = [int(r) + 1 for r in np.flatnonzero(rng.random(10) < click_p)]
        logs.append((10, swap, clicked))
    return logs


def test_recovers_a_known_propensity_from_swaps():
    true_p = np.arange(1, 101, dtype=np.float64) ** -0.7
    logs = synthetic_logs(60_000, true_p, swap_fraction=0.3, depth=6)
    found = propensity.estimate(logs, depth=6)
    assert found.source.startswith("estimated from")
    assert np.abs(found.values[:6] - true_p[:6]).max() < 0.06, (found.values[:6], true_p[:6])
    assert abs(found.eta - 0.7) < 0.15
    # the default (1/rank) is far from the truth at rank 6: the estimate is not the default by luck
    assert abs(propensity.default().values[5] - true_p[5]) > 0.1


def test_without_swaps_the_default_is_used():
    true_p = np.arange(1, 101, dtype=np.float64) ** -0.7
    found = propensity.estimate(synthetic_logs(2_000, true_p, swap_fraction=0.0, depth=6), depth=6, fallback_eta=1.0)
    assert found.source.startswith("default")
    assert found.of(4) == 0.25 and found.of(200) == 1 / 200
