"""Mixed hard-negative mining: gold first, no positive among negatives, the top fraction fixed, seeded."""
from __future__ import annotations

import numpy as np

from training.negatives import MiningConfig, mine_candidates, top_k_rows


def test_mixed_negatives():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=500).astype(np.float32)
    positives = {int(np.argmax(scores)), 7}
    cfg = MiningConfig(k=17, hard_fraction=0.5, pool=200)
    rows = mine_candidates(scores, gold=7, positives=positives, cfg=cfg, rng=np.random.default_rng(1))
    assert len(rows) == 17 and rows[0] == 7 and len(set(rows.tolist())) == 17
    assert not positives.intersection(rows[1:].tolist())
    ranked_negatives = [r for r in np.argsort(-scores) if r not in positives]
    assert rows[1:9].tolist() == ranked_negatives[:8]  # p * (K-1) = 8 fixed as the top-ranked
    again = mine_candidates(scores, 7, positives, cfg, np.random.default_rng(1))
    assert np.array_equal(rows, again)
    other = mine_candidates(scores, 7, positives, cfg, np.random.default_rng(2))
    assert not np.array_equal(rows[9:], other[9:])


def test_sampling_prefers_high_scores():
    scores = np.concatenate([np.full(50, 5.0), np.full(450, -5.0)]).astype(np.float32)
    cfg = MiningConfig(k=21, hard_fraction=0.0, pool=500)
    rows = mine_candidates(scores, gold=499, positives={499}, cfg=cfg, rng=np.random.default_rng(0))
    assert (rows[1:] < 50).mean() > 0.9


def test_top_k_rows_matches_argsort():
    rng = np.random.default_rng(3)
    q, d = rng.normal(size=(7, 16)).astype(np.float32), rng.normal(size=(300, 16)).astype(np.float32)
    scores, rows = top_k_rows(q, d, 10, chunk=3)
    expected = np.argsort(-(q @ d.T), axis=1)[:, :10]
    assert np.array_equal(rows, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(q @ d.T, expected, axis=1), rtol=1e-6)
