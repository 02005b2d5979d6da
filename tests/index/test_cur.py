"""annCUR's CUR algebra against a dense numpy reference on small low-rank matrices: exact recovery when the rank
is <= k_i, a real error when it is not, seeded anchor selection, and shape checks."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.research.anncur.cur import approximate_scores, item_embeddings, select_anchor_items


def low_rank(n_queries: int, n_items: int, rank: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n_queries, rank)) @ rng.standard_normal((rank, n_items))  # (Q, N) of rank `rank`


def split(m: np.ndarray, k_q: int) -> tuple[np.ndarray, np.ndarray]:
    """First k_q rows are the anchor queries (R_anc), the rest the test queries."""
    return m[:k_q], m[k_q:]


def reference(m_test: np.ndarray, r_anc: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """C U R written out densely in float64: C = M_test[:, anchors], U = pinv(R_anc[:, anchors])."""
    return m_test[:, anchors] @ np.linalg.pinv(r_anc[:, anchors], rcond=1e-6) @ r_anc


@pytest.mark.parametrize("rank,k_i", [(5, 5), (5, 8), (8, 20)])
def test_exact_recovery_when_rank_is_at_most_k_i(rank, k_i):
    r_anc, m_test = split(low_rank(70, 200, rank), 30)
    anchors = select_anchor_items(200, k_i, seed=3)
    emb = item_embeddings(r_anc, anchors)
    assert emb.shape == (200, k_i) and emb.dtype == np.float32
    approx = approximate_scores(m_test[:, anchors], emb)  # (40, 200)
    assert approx.shape == m_test.shape
    np.testing.assert_allclose(approx, m_test, atol=1e-3 * np.abs(m_test).max())
    np.testing.assert_allclose(approx, reference(m_test, r_anc, anchors), atol=1e-4 * np.abs(m_test).max())
    # the anchor queries themselves are reproduced too: R_anc = C_anc U R_anc
    np.testing.assert_allclose(approximate_scores(r_anc[:, anchors], emb), r_anc, atol=1e-3 * np.abs(r_anc).max())


def test_fewer_anchors_than_the_rank_only_approximate_and_match_the_reference():
    r_anc, m_test = split(low_rank(70, 200, 12), 30)
    anchors = select_anchor_items(200, 6, seed=1)
    approx = approximate_scores(m_test[:, anchors], item_embeddings(r_anc, anchors))
    error = np.linalg.norm(approx - m_test) / np.linalg.norm(m_test)
    assert error > 0.1, error  # rank 12 cannot be recovered from 6 columns
    np.testing.assert_allclose(approx, reference(m_test, r_anc, anchors), rtol=1e-4, atol=1e-3)
    # on a full-rank noisy matrix more anchors approximate better (the trend annCUR relies on)
    noisy = low_rank(70, 200, 12) + 0.05 * np.random.default_rng(9).standard_normal((70, 200))
    r_anc, m_test = split(noisy, 50)
    errors = []
    for k_i in (4, 12, 40):
        anchors = select_anchor_items(200, k_i, seed=0)
        approx = approximate_scores(m_test[:, anchors], item_embeddings(r_anc, anchors))
        errors.append(np.linalg.norm(approx - m_test) / np.linalg.norm(m_test))
    assert errors[0] > errors[1] > 0 and errors[2] < 0.5 * errors[0], errors


def test_random_anchor_selection_is_a_function_of_the_seed():
    a = select_anchor_items(1000, 50, seed=7)
    assert np.array_equal(a, select_anchor_items(1000, 50, seed=7))
    assert not np.array_equal(a, select_anchor_items(1000, 50, seed=8))
    assert len(np.unique(a)) == 50 and a.min() >= 0 and a.max() < 1000 and np.all(np.diff(a) > 0)
    assert np.array_equal(select_anchor_items(10, 10, seed=0), np.arange(10))


def test_top_anchor_selection_takes_each_querys_best_items_in_turn():
    r_anc = np.array([[9.0, 1, 8, 0, 0, 0],    # best 0, then 2
                      [9.0, 7, 0, 0, 0, 0],    # best 0 (already taken), then 1
                      [0.0, 0, 0, 0, 5, 6]])   # best 5, then 4
    assert select_anchor_items(6, 2, method="top", r_anc=r_anc).tolist() == [0, 5]  # rank 1 of every query: 0, 0, 5
    assert select_anchor_items(6, 4, method="top", r_anc=r_anc).tolist() == [0, 1, 2, 5]  # then rank 2: 2, 1, (4)
    assert np.array_equal(select_anchor_items(6, 4, method="top", r_anc=r_anc, seed=1),
                          select_anchor_items(6, 4, method="top", r_anc=r_anc, seed=2))  # no randomness


def test_bad_shapes_and_values_are_refused():
    r_anc = low_rank(10, 30, 3)
    with pytest.raises(ValueError, match="k_i must be in 1..30"):
        select_anchor_items(30, 31)
    with pytest.raises(ValueError, match="unknown anchor method"):
        select_anchor_items(30, 3, method="best")
    with pytest.raises(ValueError, match="one per item"):
        select_anchor_items(31, 3, method="top", r_anc=r_anc)
    with pytest.raises(ValueError, match="distinct"):
        item_embeddings(r_anc, np.array([1, 1, 2]))
    with pytest.raises(ValueError, match="0..29"):
        item_embeddings(r_anc, np.array([1, 30]))
    bad = r_anc.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        item_embeddings(bad, np.array([1, 2]))
    with pytest.raises(ValueError, match="3 anchor scores but the items were embedded with 2"):
        approximate_scores(np.ones((1, 3)), item_embeddings(r_anc, np.array([1, 2])))
