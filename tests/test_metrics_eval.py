"""IR metrics against values computed by hand."""
from __future__ import annotations

import math

import pytest

from sieve.evaluation.metrics import mean_metric, mrr_at_k, ndcg_at_k, recall_at_k


def test_ndcg_by_hand():
    judged = {"a": 1, "b": 2}
    # ranking: x, b, a -> DCG = 2/log2(3) + 1/log2(4); ideal = 2/1 + 1/log2(3)
    expected = (2 / math.log2(3) + 1 / 2) / (2 + 1 / math.log2(3))
    assert ndcg_at_k(["x", "b", "a"], judged, 10) == pytest.approx(expected)
    assert ndcg_at_k(["a", "b"], {"a": 1, "b": 1}, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "y"], judged, 10) == 0.0
    assert ndcg_at_k(["x", "a"], judged, 1) == 0.0


def test_mrr_and_recall_by_hand():
    judged = {"a": 1, "b": 1, "c": 0}
    assert mrr_at_k(["c", "x", "b"], judged, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["c", "x", "b"], judged, 2) == 0.0
    assert recall_at_k(["a", "x", "c"], judged, 10) == pytest.approx(0.5)


def test_mean_skips_queries_without_relevant_documents():
    qrels = {"q1": {"a": 1}, "q2": {"b": 0}}
    assert mean_metric(recall_at_k, {"q1": ["a"], "q2": ["b"]}, qrels, 10) == 1.0
