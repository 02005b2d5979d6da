"""The click memory's per-document term gated on who clicked each document (`ClickMemory.doc_related`, `sieve feedback
learn --doc-related`): a document's popularity is added for a query only where a remembered query whose users clicked
that document is close to it, served and selected alike."""
import numpy as np
import pytest

from sieve.feedback.dataset import ClickLists
from sieve.feedback.memory import ClickMemory, Shown, tally
from sieve.training.memory_learn import Scored, select

Q1 = np.array([1.0, 0.0, 0.0, 0.0], np.float32)  # the remembered query whose users clicked x
FAR = np.array([0.0, 1.0, 0.0, 0.0], np.float32)  # the remembered query whose users clicked y: another topic
HALF = np.array([0.5, 0.0, 0.866, 0.0], np.float32)  # a new query: cosine 0.5 with Q1 (under near_min), 0 with FAR


class Flat:
    """p(examined) = 1 at every rank."""
    source = "test"

    @staticmethod
    def of(rank: int) -> float:
        return 1.0


# y is the more popular document (clicked in every answer, x in 3 of 4), but only by users of another topic
COUNTED = [Shown("q1", ["x", "w"], {"x"})] * 15 + [Shown("q1", ["x", "w"], set())] * 5 + \
    [Shown("q2", ["y", "w"], {"y"})] * 40
VECTORS = {"q1": Q1, "q2": FAR}


def built(doc_related: float | None) -> ClickMemory:
    return ClickMemory.build(tally(COUNTED, Flat()), 0.0, 1.0, 2.0, vectors=VECTORS, doc_related=doc_related)


def test_the_gated_term_lifts_only_documents_related_queries_clicked(tmp_path):
    plain, gated = built(None), built(0.3)
    assert plain.docs["y"] > plain.docs["x"] > 0 > plain.docs["w"]
    assert plain.boost("new", ["x", "y", "w"], HALF).tolist() == pytest.approx([plain.docs["x"], plain.docs["y"],
                                                                                  plain.docs["w"]])
    assert gated.boost("new", ["x", "y", "w", "z"], HALF).tolist() == pytest.approx([gated.docs["x"], 0, 0, 0])
    assert gated.boost("new", ["x", "y"], FAR).tolist() == pytest.approx([0, gated.docs["y"]])
    assert gated.boost("new", ["x", "y"], None).tolist() == [0.0, 0.0]  # no vector: no clicker is close
    assert built(0.6).boost("new", ["x", "y"], HALF).tolist() == [0.0, 0.0]  # cosine 0.5 < 0.6
    loaded = ClickMemory.load(gated.save(tmp_path).parent)
    assert loaded.doc_related == 0.3
    assert loaded.boost("new", ["x", "y"], HALF).tolist() == \
        pytest.approx(gated.boost("new", ["x", "y"], HALF).tolist())
    assert ClickMemory.build(tally(COUNTED, Flat()), 0.0, 0.0, 2.0, vectors=VECTORS, doc_related=0.3).doc_related \
        is None  # no per-document term: nothing to gate


def test_closest_clicker_is_the_best_cosine_over_the_queries_that_clicked():
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(30)]
    answers, vectors = [], {}
    for q in range(40):
        key = f"q{q}"
        vectors[key] = rng.normal(size=8).astype(np.float32)
        shown = list(rng.choice(docs, 5, replace=False))
        answers += [Shown(key, shown, {d for d in shown if rng.random() < 0.3})] * 3
    memory = ClickMemory.build(tally(answers, Flat()), 0.0, 1.0, 2.0, vectors=vectors, doc_related=0.0)
    query = rng.normal(size=8).astype(np.float32)
    sims = memory.similarities(query)
    row = {k: i for i, k in enumerate(memory.near_keys)}
    expect = [max([float(sims[row[k]]) for k, table in memory.pairs.items() if table.get(d, 0.0) > 0],
                  default=-np.inf) for d in docs + ["unknown"]]
    assert memory.closest_clicker(docs + ["unknown"], sims).tolist() == pytest.approx(expect)


def judged() -> Scored:
    """One clicked answer of a new query (vector HALF): y served first, x (clicked) second."""
    lists = ClickLists(HALF[None, :], np.array([[0, 1]]), np.zeros((1, 2, 1), np.float32),
                       np.array([[0.0, 1.0]], np.float32), ["qa"])
    return Scored(lists, np.array([[1.0, 0.9]]), [["y", "x"]])


def test_a_fixed_gate_is_selected_with_throughout():
    chosen, grid = select([(COUNTED, judged())], Flat(), 0.05, VECTORS, doc_related=0.3)
    assert chosen["w_doc"] > 0 and chosen["doc_related"] == 0.3 and grid[1]["validation_ips_dcg"] == pytest.approx(1.0)
    assert all(r["doc_related"] == (0.3 if r["w_doc"] else None) for r in grid[1:])


def test_selection_gates_the_term_where_other_topics_popularity_would_cost():
    """Ungated, the per-document term lifts y (more popular) above x whatever its weight, so the first pass keeps no
    memory; the second pass finds the gate under which x, which a related query's users clicked, rises."""
    plain, _ = select([(COUNTED, judged())], Flat(), 0.05, VECTORS)
    assert plain["w_doc"] == 0.0 and plain["w_near"] == 0.0
    chosen, grid = select([(COUNTED, judged())], Flat(), 0.05, VECTORS, doc_related="select")
    assert chosen["w_doc"] > 0 and chosen["doc_related"] is not None and chosen["doc_related"] <= 0.5
    memory = ClickMemory.build(tally(COUNTED, Flat()), chosen["w_query"], chosen["w_doc"], chosen["pseudo"],
                               w_near=chosen["w_near"], near_min=chosen["near_min"], vectors=VECTORS,
                               near_k=chosen["near_k"], doc_related=chosen["doc_related"])
    assert judged().dcg(memory)[0] == pytest.approx(1.0) and judged().none()[0] < 1.0
    assert grid[1]["validation_ips_dcg"] == pytest.approx(1.0)


def test_the_command_takes_the_gate():
    import argparse

    from sieve.training.feedback_cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["feedback", "learn", "--doc-related", "off"]).doc_related == "off"
    assert parser.parse_args(["feedback", "learn", "--doc-related", "select"]).doc_related == "select"
    assert parser.parse_args(["feedback", "learn", "--doc-related", "0.3"]).doc_related == 0.3
    for bad in ("1.5", "near"):
        with pytest.raises(SystemExit):
            parser.parse_args(["feedback", "learn", "--doc-related", bad])
