"""The click memory's gated per-document term (`ClickMemory.doc_gated`, `sieve feedback learn --doc-gated`): the
popularity of a document other users clicked is added only for a query the memory knows (remembered itself, or a
remembered other query at cosine >= near_min), served and selected alike."""
from dataclasses import replace

import numpy as np
import pytest

from sieve.feedback.dataset import ClickLists
from sieve.feedback.memory import ClickMemory, Shown, tally
from sieve.training.memory_learn import Scored, select

NEAR = np.array([1.0, 0.1, 0.0, 0.0], np.float32)  # cosine 0.995 with the remembered query q1
FAR = np.array([0.0, 1.0, 0.0, 0.0], np.float32)  # cosine 0 with it


class Flat:
    """p(examined) = 1 at every rank."""
    source = "test"

    @staticmethod
    def of(rank: int) -> float:
        return 1.0


def remembered(doc_gated: bool) -> ClickMemory:
    return ClickMemory(w_query=0.0, w_doc=10.0, pseudo=2.0, prior=0.1, pairs={"q1": {"x": 1.0}}, docs={"x": 1.0},
                       near_min=0.8, near_keys=["q1"], near_vectors=np.array([[1.0, 0.0, 0.0, 0.0]], np.float32),
                       doc_gated=doc_gated)


def test_the_gated_term_speaks_only_for_known_queries(tmp_path):
    gated = remembered(True)
    assert gated.boost("stranger", ["x", "y"], FAR).tolist() == [0.0, 0.0]
    assert gated.boost("stranger", ["x", "y"], None).tolist() == [0.0, 0.0]  # no vector: not known
    assert gated.boost("neighbour", ["x", "y"], NEAR).tolist() == [10.0, 0.0]
    assert gated.boost("q1", ["x", "y"], FAR).tolist() == [10.0, 0.0]  # remembered itself
    assert remembered(False).boost("stranger", ["x", "y"], FAR).tolist() == [10.0, 0.0]
    loaded = ClickMemory.load(gated.save(tmp_path).parent)
    assert loaded.doc_gated and loaded.boost("stranger", ["x"], FAR).tolist() == [0.0]
    assert loaded.boost("neighbour", ["x"], NEAR).tolist() == [10.0]


def test_build_keeps_the_vectors_the_gate_reads():
    counts = tally([Shown("q1", ["x", "y"], {"x"})] * 5 + [Shown("q2", ["y", "x"], set())] * 5, Flat())
    vectors = {"q1": np.array([1.0, 0.0, 0.0, 0.0], np.float32), "q2": FAR}
    memory = ClickMemory.build(counts, 0.0, 1.0, 2.0, vectors=vectors, near_min=0.8, doc_gated=True)
    assert memory.doc_gated and memory.w_near == 0.0 and sorted(memory.near_keys) == ["q1", "q2"]
    assert memory.boost("new", ["x"], NEAR)[0] > 0 and memory.boost("new", ["x"], -NEAR)[0] == 0.0
    assert not ClickMemory.build(counts, 0.0, 1.0, 2.0, vectors=vectors).doc_gated


def judged_list(vector: np.ndarray) -> Scored:
    """One clicked answer of query q (never remembered): y served first, x (clicked) second."""
    lists = ClickLists(vector[None, :], np.array([[0, 1]]), np.zeros((1, 2, 1), np.float32),
                       np.array([[0.0, 1.0]], np.float32), ["q"])
    return Scored(lists, np.array([[1.0, 0.9]]), [["y", "x"]])


@pytest.mark.parametrize("vector, gated, lifted", [(FAR, False, True), (FAR, True, False), (NEAR, True, True)])
def test_selection_scores_the_term_as_it_will_be_served(vector, gated, lifted):
    """Users of q1 clicked x: promoting x lifts q's clicked x to rank 1, unless the gate keeps the term off q."""
    counted = [Shown("q1", ["y", "x"], {"x"})] * 20 + [Shown("q1", ["x", "y"], {"x"})] * 20
    chosen, _ = select([(counted, judged_list(vector))], Flat(), 0.05,
                       {"q1": np.array([1.0, 0.0, 0.0, 0.0], np.float32)}, doc_gated=gated)
    assert (chosen["w_doc"] > 0 or chosen["w_near"] > 0) == lifted
    assert chosen["doc_gated"] == (gated and chosen["w_doc"] > 0)
    scored = judged_list(vector)
    if lifted and chosen["w_doc"] > 0:
        memory = ClickMemory.build(tally(counted, Flat()), chosen["w_query"], chosen["w_doc"], chosen["pseudo"],
                                   w_near=chosen["w_near"], near_min=chosen["near_min"],
                                   vectors={"q1": np.array([1.0, 0.0, 0.0, 0.0], np.float32)},
                                   near_k=chosen["near_k"], doc_gated=chosen["doc_gated"])
        assert scored.dcg(memory)[0] == pytest.approx(1.0) and scored.none()[0] < 1.0
    assert replace(remembered(gated), near_min=0.999).boost("n", ["x"], NEAR)[0] == (0.0 if gated else 10.0)
