"""ClickNeighbours (exploration led by other users' clicks): the largest cosine to a click's query per candidate,
only from near_min; a ring that forgets the oldest click first; vectors of another size or zero are ignored."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.feedback.neighbours import ClickNeighbours


def unit(*values):
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_promoted_is_the_best_cosine_of_a_near_click_per_candidate():
    n = ClickNeighbours(capacity=10, near_min=0.8)
    n.add([1.0, 0.0, 0.0], "a")  # same direction as the query below
    n.add(unit(1.0, 0.6, 0.0) * 3, "b")  # scale does not matter; cos 0.857
    n.add(unit(1.0, 1.0, 0.0), "c")  # cos 0.707: below near_min
    n.add(unit(1.0, 0.3, 0.0), "b")  # a second click on b from a closer query: cos 0.958
    got = n.promoted(np.array([2.0, 0.0, 0.0]), ["c", "b", "x", "a"])
    assert got[0] == 0.0 and got[2] == 0.0
    assert got[1] == pytest.approx(float(unit(1.0, 0.3, 0.0)[0]), abs=1e-6)
    assert got[3] == pytest.approx(1.0, abs=1e-6)


def test_the_ring_forgets_the_oldest_click_first():
    n = ClickNeighbours(capacity=2, near_min=0.5)
    for doc in ("a", "b", "c"):
        n.add([1.0, 0.0], doc)
    assert len(n) == 2
    assert list(n.promoted([1.0, 0.0], ["a", "b", "c"]) > 0) == [False, True, True]


def test_nothing_promoted_without_clicks_vectors_or_fitting_shapes():
    n = ClickNeighbours(capacity=4, near_min=0.0)
    assert not n.promoted([1.0, 0.0], ["a"]).any()
    n.add([0.0, 0.0], "a")  # a zero vector is not kept
    n.add([1.0, 0.0], "b")
    n.add([1.0, 0.0, 0.0], "c")  # another size than the first click's: not kept
    assert len(n) == 1
    assert not n.promoted(None, ["b"]).any() and not n.promoted([1.0, 0.0, 0.0], ["b"]).any()
    assert n.promoted([1.0, 0.0], ["b", "c"]).tolist() == [pytest.approx(1.0), 0.0]
