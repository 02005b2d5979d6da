"""Policy-aware click weights (`sieve feedback learn --propensities policy`, feedback/dataset.py `Logs.entries`): a
click weighs 1 / its document's exposure over its query's answers, so a document exploration showed in one answer
of four counts four times what the same click would count had every answer shown it there."""
import numpy as np
import pytest

from sieve.feedback import propensity
from sieve.feedback.dataset import Logs
from sieve.feedback.records import pack

CANDIDATES = [f"d{i}" for i in range(12)]


def impression(rid: str, key: str, shown: list[str], t: float) -> dict:
    n = len(CANDIDATES)
    return {"request_id": rid, "endpoint": "/search", "query_key": key, "shown": shown, "t": t,
            "candidates": CANDIDATES, "vector": pack(np.ones(4)), "be": pack(np.zeros(n)), "bm25": pack(np.zeros(n))}


@pytest.fixture
def logs() -> Logs:
    top = CANDIDATES[:3]
    explored = [top[0], "d9", top[2]]  # one answer in four showed d9 at rank 2 (exploration), in place of d1
    impressions = [impression("a", "q", top, 0), impression("b", "q", top, 1), impression("c", "q", top, 2),
                   impression("e", "q", explored, 3), impression("f", "other", ["d9", "d1", "d2"], 4)]
    events = [{"request_id": "a", "doc_id": "d1", "type": "click"},  # d1: shown at rank 2 by 3 answers of 4
              {"request_id": "e", "doc_id": "d9", "type": "click"},  # d9: at rank 2 by 1 answer of 4
              {"request_id": "f", "doc_id": "d9", "type": "click"}]  # d9 at rank 1 by the other query's only answer
    return Logs({r["request_id"]: r for r in impressions}, events)


def targets(logs: Logs, kind: str, clip: float = 100.0) -> dict[str, dict[str, float]]:
    entries, _ = logs.entries(propensity.default(), clip, kind)
    return {e.key + "/" + next(iter(e.ranks)): e.targets for e in entries}


def test_position_weights_a_click_by_its_rank_alone(logs):
    got = targets(logs, "position")
    assert got["q/d1"]["d1"] == pytest.approx(2.0)  # 1 / p(2), p(r) = 1/r
    assert got["q/d9"]["d9"] == pytest.approx(2.0)
    assert got["other/d9"]["d9"] == pytest.approx(1.0)


def test_policy_weights_a_click_by_its_exposure_over_the_query_answers(logs):
    got = targets(logs, "policy")
    assert got["q/d1"]["d1"] == pytest.approx(4 / 1.5)  # exposure (3 x 1/2) / 4 answers
    assert got["q/d9"]["d9"] == pytest.approx(4 / 0.5)  # exposure (1 x 1/2) / 4 answers: explored, counts 4x
    assert got["other/d9"]["d9"] == pytest.approx(1.0)  # its query's exposure only, not the other query's
    assert targets(logs, "policy", clip=5.0)["q/d9"]["d9"] == pytest.approx(5.0)  # clipped as before
