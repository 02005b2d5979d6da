"""The click memory's estimates over the logged support (`LearnConfig.support` / `guard_support` "shown",
training/memory_learn.py): a candidate no logged answer of its query showed is ranked below every other by the
estimate, so a memory that promotes it is neither charged for it (it could not have been clicked) nor credited."""
import numpy as np
import pytest

from sieve.feedback.dataset import ClickLists
from sieve.feedback.memory import ClickMemory
from sieve.training.memory_learn import Scored, support

IDS = [["a", "b", "c", "x", None]]  # x: never shown for q; None: padding


def scored_list(shown: np.ndarray | None) -> Scored:
    targets = np.array([[0.0, 2.0, 0.0, 0.0, 0.0]], np.float32)  # b was clicked (weight 2)
    lists = ClickLists(np.ones((1, 4), np.float32), np.array([[0, 1, 2, 3, -1]]), np.zeros((1, 5, 1), np.float32),
                       targets, ["q"])
    base = np.array([[3.0, 2.0, 1.0, 0.0, -np.inf]])  # served order a, b, c, x
    return Scored(lists, base, IDS, shown=shown)


def promoting(doc: str) -> ClickMemory:
    return ClickMemory(w_query=0.0, w_doc=10.0, pseudo=2.0, prior=0.1, pairs={}, docs={doc: 1.0})


def test_support_marks_what_the_query_answers_showed():
    exposure = {"q": (2, {"a": 1.0, "b": 0.5, "c": 0.3})}
    assert support(["q"], IDS, exposure).tolist() == [[True, True, True, False, False]]
    assert not support(["other"], IDS, exposure).any()  # a query without answers: nothing is in its support


def test_promoting_an_unshown_document_costs_only_without_the_support():
    shown = support(["q"], IDS, {"q": (1, {"a": 1.0, "b": 0.5, "c": 0.3})})
    everything, on_support = scored_list(None), scored_list(shown)
    served = 2.0 / np.log2(3.0)  # b at rank 2
    assert everything.none()[0] == pytest.approx(served) and on_support.none()[0] == pytest.approx(served)
    # x above everything: b falls to rank 3 when every candidate is ranked, stays at 2 on the support
    assert everything.dcg(promoting("x"))[0] == pytest.approx(2.0 / np.log2(4.0))
    assert on_support.dcg(promoting("x"))[0] == pytest.approx(served)
    # a shown document promoted above b still costs on the support
    assert on_support.dcg(promoting("c"))[0] == pytest.approx(2.0 / np.log2(4.0))
    # and promoting the clicked one earns on both
    assert on_support.dcg(promoting("b"))[0] == pytest.approx(2.0) == everything.dcg(promoting("b"))[0]


def test_the_both_guard_refuses_what_the_charged_estimate_puts_below_the_served_ranking():
    """guard_support "both" (the default): a memory that clears 0 on the shown support is refused all the same when
    the estimate over every candidate, which charges each promotion of a document no answer showed, puts it clearly
    below the served ranking (its interval wholly under 0); level (an interval across 0) or above, it passes."""
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.memory_learn import memory_verdict

    cfg = LearnConfig(min_heldout=50)
    assert cfg.guard_support == "both"
    passed = {"heldout_answers": 400, "delta": 0.018, "interval": [0.010, 0.025]}
    assert memory_verdict(passed, cfg) is None  # the shown support alone
    assert memory_verdict({**passed, "charged": {"heldout_answers": 400, "delta": 0.004,
                                                  "interval": [-0.003, 0.012]}}, cfg) is None
    refused = memory_verdict({**passed, "charged": {"heldout_answers": 400, "delta": -0.09,
                                                     "interval": [-0.1, -0.08]}}, cfg)
    assert "once every promotion of a document no answer of its query showed is charged" in refused
    update = {**passed, "vs_no_memory": {"heldout_answers": 400, "delta": 0.03, "interval": [0.02, 0.04]}}
    assert memory_verdict(update, cfg) is None
    assert "is charged" in memory_verdict({**update, "charged": {"heldout_answers": 400, "delta": -0.011,
                                                                  "interval": [-0.02, -0.002]}}, cfg)
    # level: a point under 0 with an interval across it (the fortieth session's seed 40 log) is not below
    assert memory_verdict({**update, "charged": {"heldout_answers": 400, "delta": -0.001,
                                                  "interval": [-0.01, 0.008]}}, cfg) is None
