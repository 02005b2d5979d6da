"""Mixed hard-negative mining: gold first, no positive among negatives, the top fraction fixed, seeded."""
from __future__ import annotations

import numpy as np

from sieve.training.negatives import MiningConfig, mine_candidates, mine_listwise, top_k_rows


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


def test_listwise_mining_keeps_relevant_documents_and_stays_in_the_pool():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=500).astype(np.float32)
    ranked = np.argsort(-scores, kind="stable")
    relevant = {int(ranked[0]), int(ranked[40]), int(ranked[450])}  # rank 450 lies outside the pool
    cfg = MiningConfig(k=20, hard_fraction=0.5, pool=100)
    rows = mine_listwise(scores, relevant, cfg, np.random.default_rng(1))
    assert len(rows) == 20 and len(set(rows.tolist())) == 20
    assert set(rows.tolist()) <= set(ranked[:100].tolist())  # nothing from beyond the pool
    assert rows[:10].tolist() == ranked[:10].tolist()  # p * K fixed as the top-ranked, relevant ones included
    assert np.array_equal(rows, mine_listwise(scores, relevant, cfg, np.random.default_rng(1)))


def test_listwise_mining_inserts_a_relevant_document_or_gives_up():
    scores = -np.arange(500, dtype=np.float32)  # row r has rank r
    cfg = MiningConfig(k=10, hard_fraction=0.5, pool=100)
    rows = mine_listwise(scores, {90}, cfg, np.random.default_rng(0))
    assert 90 in rows.tolist() and rows[:5].tolist() == [0, 1, 2, 3, 4]
    assert mine_listwise(scores, {300}, cfg, np.random.default_rng(0)) is None  # relevant only beyond the pool
