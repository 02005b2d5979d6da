"""Click noise (sieve/feedback/noise.py, `sieve feedback learn --noise estimated`): the rates of clicks on relevant and
non-relevant results recovered from counts alone, and the affine correction of the selection's click estimate."""
import numpy as np
import pytest

from sieve.feedback import propensity
from sieve.feedback.dataset import ClickLists, click_weight
from sieve.feedback.memory import Shown, tally
from sieve.feedback.noise import MIN_PAIRS, estimate, expected_noise
from sieve.training.memory_learn import Scored, noise_of, without_noise


def simulated_counts(a: float, b: float, share: float, pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Clicks and expected examinations per pair from a position-based model with noise: each pair shown 1-40
    times at ranks 1-10, examined with 1/rank, clicked with a if relevant (with probability `share`), else b."""
    rng = np.random.default_rng(seed)
    clicks, exams = np.zeros(pairs), np.zeros(pairs)
    for i in range(pairs):
        rate = a if rng.random() < share else b
        p = 1.0 / rng.integers(1, 11, size=rng.integers(1, 41))
        clicks[i], exams[i] = (rng.random(len(p)) < p * rate).sum(), p.sum()
    return clicks, exams


@pytest.mark.parametrize("b", [0.05, 0.2])
def test_the_noise_rate_is_recovered_from_counts(b):
    clicks, exams = simulated_counts(0.9, b, 0.15, 3000, seed=1)
    fit = estimate(clicks, exams)
    assert fit is not None and fit.pairs == 3000
    assert fit.noise == pytest.approx(b, abs=0.02)
    assert fit.relevant == pytest.approx(0.9, abs=0.1)
    assert fit.share == pytest.approx(0.15, abs=0.04)


def test_no_estimate_without_evidence():
    assert estimate(np.ones(MIN_PAIRS - 1), np.ones(MIN_PAIRS - 1)) is None
    assert estimate(np.zeros(100), np.ones(100)) is None  # nobody clicked
    assert estimate(np.ones(100), np.zeros(100)) is None  # nothing examined


def test_the_fit_reads_the_memory_counts():
    answers = [Shown(f"q{i}", ["x", "y", "z"], {"x"} if i % 3 else set()) for i in range(60)]
    fit = noise_of(tally(answers, propensity.default(10)))
    assert fit is not None and fit.pairs == 180 and fit.noise < fit.relevant


@pytest.mark.parametrize("policy", [False, True])
def test_noise_credit_is_one_weighted_click_per_answer_that_showed_it(policy):
    """Four answers of q, two with y first and two with x first, examined with 1/rank: noise at rate 1 would click
    each document 1.5 times in expectation, each click weighing 1/p(rank) (position) or 4 / 3 (policy: 3
    examinations over 4 answers), so 4 in all, either way."""
    answers = [Shown("q", ["y", "x"], set())] * 2 + [Shown("q", ["x", "y"], set())] * 2 + [Shown("other", ["y"], set())]
    props = propensity.default(10)
    exposure = {"q": (4, {"y": 3.0, "x": 3.0})}
    credit = expected_noise(answers, {"q"}, props, click_weight(props, 100.0, exposure if policy else {}))
    assert credit == {("q", "y"): pytest.approx(4.0), ("q", "x"): pytest.approx(4.0)}


def test_the_correction_charges_shown_documents_once_per_query():
    """Two clicked lists of q and one of r: b x credit comes off each document q's answers showed, on q's first list
    only; a candidate no answer showed (z) keeps its target."""
    lists = ClickLists(np.zeros((3, 2), np.float32), np.array([[0, 1, 2]] * 3), np.zeros((3, 3, 1), np.float32),
                       np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 0.0, 0.0]], np.float32), ["q", "q", "r"])
    scored = Scored(lists, np.zeros((3, 3)), [["y", "x", "z"]] * 3)
    answers = [Shown("q", ["y", "x"], {"y"}), Shown("q", ["x", "y"], {"x"}), Shown("r", ["y"], {"y"})]
    props = propensity.default(10)
    without_noise(scored, expected_noise(answers, None, props, click_weight(props, 100.0, {})), 0.25)
    assert scored.lists.targets.tolist() == [[0.5, -0.5, 0.0], [0.0, 2.0, 0.0], [0.75, 0.0, 0.0]]


def test_the_guards_correction_gives_each_answer_its_share():
    lists = ClickLists(np.zeros((2, 2), np.float32), np.array([[0, 1]] * 2), np.zeros((2, 2, 1), np.float32),
                       np.array([[1.0, 0.0], [0.0, 2.0]], np.float32), ["q", "q"])
    scored = Scored(lists, np.zeros((2, 2)), [["y", "x"]] * 2)
    answers = [Shown("q", ["y", "x"], {"y"}), Shown("q", ["x", "y"], {"x"})]
    props = propensity.default(10)
    without_noise(scored, expected_noise(answers, None, props, click_weight(props, 100.0, {})), 0.25, spread=True)
    assert scored.lists.targets.tolist() == [[0.75, -0.25], [-0.25, 1.75]]


def test_the_command_corrects_by_default_and_can_count_as_is():
    import argparse

    from sieve.training.feedback_cli import register
    from sieve.training.feedback_config import LearnConfig

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert LearnConfig().noise == "estimated"
    assert parser.parse_args(["feedback", "learn"]).noise == "estimated"
    assert parser.parse_args(["feedback", "learn", "--noise", "off"]).noise == "off"
    with pytest.raises(SystemExit):
        parser.parse_args(["feedback", "learn", "--noise", "maybe"])
