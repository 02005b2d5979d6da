"""benchmarks/feedback_memory_oracle.py: its rank correlation (the figure RESULTS.md quotes; ties share their mean rank)
and the selection rules it compares with the learner's."""
from __future__ import annotations

import numpy as np

from benchmarks.feedback_memory_oracle import selection_rules, spearman


def test_rank_correlation_with_ties():
    x = [0.3, 0.1, 0.1, 0.7, 0.0]
    assert abs(spearman(x, [v ** 3 + 5 for v in x]) - 1.0) < 1e-12  # any increasing transform
    assert abs(spearman(x, [-v for v in x]) + 1.0) < 1e-12
    # by hand: ranks of x with the tie averaged: 3, 1.5, 1.5, 4, 0; of y: 0, 1, 2, 3, 4
    rx, ry = np.array([3, 1.5, 1.5, 4, 0]), np.arange(5.0)
    want = np.corrcoef(rx, ry)[0, 1]
    assert abs(spearman(x, [0, 1, 2, 3, 4]) - want) < 1e-12


def test_selection_rules_each_pick_what_they_say():
    def row(name, folds):
        return {"name": name, "fold_estimates": folds, "click_estimate": float(np.mean(folds))}

    rows = [row("lucky", [0.10, -0.05, -0.04, 0.00, 0.04]),  # the best mean (0.01), carried by one fold
            row("steady", [0.006, 0.007, 0.006, 0.007, 0.006]),  # every fold positive, the best worst fold
            row("median", [-0.09, -0.08, 0.009, 0.009, 0.009]),  # the best median fold, a poor mean
            row("poor", [0.0, 0.0, 0.0, 0.0, 0.0])]
    picked = {rule: r["name"] for rule, r in selection_rules(rows).items()}
    assert picked["best_mean (the learner's rule)"] == "lucky"
    assert picked["maximin_fold"] == "steady"
    assert picked["median_fold"] == "median"
    assert picked["mean_less_one_se"] == "steady"  # 0.0064 less a tiny spread beats 0.01 less a wide one
    assert picked["mean_rank"] == "steady"  # mean rank over folds 1.0, lucky and median 1.4


def test_judged_counts_are_the_ceilings():
    """The same answers counted as feedback_sim.py's ceiling counts them: every shown document examined once per
    answer, clicked exactly when the train qrels judge it relevant (grade > 0), whatever the users clicked."""
    from types import SimpleNamespace

    from benchmarks.feedback_memory_oracle import ceiling_counts
    from sieve.feedback.memory import Shown
    from sieve.feedback.records import query_key

    train = SimpleNamespace(queries={"q1": "fish  oil", "q2": "vitamin d"},
                            qrels={"q1": {"d1": 2, "d3": 0}, "q2": {"d2": 1}})
    k1, k2 = query_key("fish oil"), query_key("vitamin d")
    answers = [Shown(k1, ["d3", "d1", "d2"], {"d3"}), Shown(k1, ["d1", "d2"], set()),
               Shown(k2, ["d1", "d2"], {"d1"}), Shown("unjudged", ["d1"], {"d1"})]
    counts = ceiling_counts(answers, train)
    assert counts.pairs[(k1, "d1")] == [2.0, 2.0]  # relevant, shown twice: two clicks, two examinations
    assert counts.pairs[(k1, "d3")] == [0.0, 1.0]  # grade 0 and clicked by a user: not a click here
    assert counts.pairs[(k2, "d1")] == [0.0, 1.0]
    assert counts.pairs[(k2, "d2")] == [1.0, 1.0]
    assert counts.pairs[("unjudged", "d1")] == [0.0, 1.0]  # a query without qrels: nothing relevant
    assert counts.docs["d1"] == [2.0, 4.0] and counts.answers == 4
