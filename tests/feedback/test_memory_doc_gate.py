"""The click memory's gated per-document term (`ClickMemory.doc_gate`, `sieve feedback learn --doc-gate`): the
popularity of a document other users clicked is added only for a query the memory knows (remembered itself, or a
remembered query at cosine >= the gate), served and selected alike."""
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


def remembered(doc_gate: float | None) -> ClickMemory:
    return ClickMemory(w_query=0.0, w_doc=10.0, pseudo=2.0, prior=0.1, pairs={"q1": {"x": 1.0}}, docs={"x": 1.0},
                       near_min=0.9, near_keys=["q1"], near_vectors=np.array([[1.0, 0.0, 0.0, 0.0]], np.float32),
                       doc_gate=doc_gate)


def test_the_gated_term_speaks_only_for_known_queries(tmp_path):
    gated = remembered(0.6)
    assert gated.boost("stranger", ["x", "y"], FAR).tolist() == [0.0, 0.0]
    assert gated.boost("stranger", ["x", "y"], None).tolist() == [0.0, 0.0]  # no vector: not known
    assert gated.boost("neighbour", ["x", "y"], NEAR).tolist() == [10.0, 0.0]
    assert gated.boost("q1", ["x", "y"], FAR).tolist() == [10.0, 0.0]  # remembered itself
    halfway = np.array([0.7, 0.714, 0.0, 0.0], np.float32)  # cosine 0.70: under near_min, over the gate
    assert gated.boost("between", ["x"], halfway).tolist() == [10.0]
    assert remembered(0.75).boost("between", ["x"], halfway).tolist() == [0.0]
    assert remembered(None).boost("stranger", ["x", "y"], FAR).tolist() == [10.0, 0.0]
    loaded = ClickMemory.load(gated.save(tmp_path).parent)
    assert loaded.doc_gate == 0.6 and loaded.boost("stranger", ["x"], FAR).tolist() == [0.0]
    assert loaded.boost("neighbour", ["x"], NEAR).tolist() == [10.0]


def test_build_keeps_the_vectors_the_gate_reads():
    counts = tally([Shown("q1", ["x", "y"], {"x"})] * 5 + [Shown("q2", ["y", "x"], set())] * 5, Flat())
    vectors = {"q1": np.array([1.0, 0.0, 0.0, 0.0], np.float32), "q2": FAR}
    memory = ClickMemory.build(counts, 0.0, 1.0, 2.0, vectors=vectors, doc_gate=0.8)
    assert memory.doc_gate == 0.8 and memory.w_near == 0.0 and sorted(memory.near_keys) == ["q1", "q2"]
    assert memory.boost("new", ["x"], NEAR)[0] > 0 and memory.boost("new", ["x"], -NEAR)[0] == 0.0
    assert ClickMemory.build(counts, 0.0, 1.0, 2.0, vectors=vectors).doc_gate is None
    assert ClickMemory.build(counts, 0.0, 0.0, 2.0, vectors=vectors, doc_gate=0.8).doc_gate is None  # no such term


def judged_list(vector: np.ndarray) -> Scored:
    """One clicked answer of query q (never remembered): y served first, x (clicked) second."""
    lists = ClickLists(vector[None, :], np.array([[0, 1]]), np.zeros((1, 2, 1), np.float32),
                       np.array([[0.0, 1.0]], np.float32), ["q"])
    return Scored(lists, np.array([[1.0, 0.9]]), [["y", "x"]])


@pytest.mark.parametrize("vector, gate, lifted", [(FAR, None, True), (FAR, 0.6, False), (NEAR, 0.6, True)])
def test_selection_scores_the_term_as_it_will_be_served(vector, gate, lifted):
    """Users of q1 clicked x: promoting x lifts q's clicked x to rank 1, unless the gate keeps the term off q."""
    counted = [Shown("q1", ["y", "x"], {"x"})] * 20 + [Shown("q1", ["x", "y"], {"x"})] * 20
    chosen, _ = select([(counted, judged_list(vector))], Flat(), 0.05,
                       {"q1": np.array([1.0, 0.0, 0.0, 0.0], np.float32)}, doc_gate=gate)
    assert (chosen["w_doc"] > 0 or chosen["w_near"] > 0) == lifted
    assert chosen["doc_gate"] == (gate if chosen["w_doc"] > 0 else None)
    scored = judged_list(vector)
    if lifted and chosen["w_doc"] > 0:
        memory = ClickMemory.build(tally(counted, Flat()), chosen["w_query"], chosen["w_doc"], chosen["pseudo"],
                                   w_near=chosen["w_near"], near_min=chosen["near_min"],
                                   vectors={"q1": np.array([1.0, 0.0, 0.0, 0.0], np.float32)},
                                   near_k=chosen["near_k"], doc_gate=chosen["doc_gate"])
        assert scored.dcg(memory)[0] == pytest.approx(1.0) and scored.none()[0] < 1.0


def test_the_command_takes_a_cosine_or_off():
    from sieve.training.feedback_cli import cosine_or_off

    assert cosine_or_off("0.6") == 0.6 and cosine_or_off("off") is None
    for bad in ("1.5", "near"):
        with pytest.raises(Exception, match="cosine"):
            cosine_or_off(bad)
