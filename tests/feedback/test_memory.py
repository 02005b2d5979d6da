"""The click memory without models: COEC removes position bias from synthetic logs, the memory re-sorts a candidate
list by score plus its boost (a clicked document from deep in the list rises, one examined often and never clicked
falls, `score` never increases), it survives a save and load, and the store publishes atomically."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sieve.feedback import propensity
from sieve.feedback.memory import ClickMemory, Shown, log_ratio, tally
from sieve.feedback.memory_store import MemoryStore
from sieve.pipeline.candidates import Candidates, ranked_scores
from sieve.pipeline.searcher import remembered


def test_coec_recovers_relevance_under_position_bias():
    """40 documents with known click probabilities when examined; each answer shows 10 of them in random order and
    rank r is examined with (1/r)^1. Raw CTR mixes relevance with where a document happened to be shown (documents
    shown mostly low look bad); clicks over expected examinations recovers the relevance."""
    rng = np.random.default_rng(0)
    relevance = rng.uniform(0.05, 0.9, 40)
    docs = [f"d{i}" for i in range(40)]
    # a biased logger: low-numbered documents tend to be shown high, so raw CTR favours them
    answers = []
    for _ in range(60_000):
        shown = list(np.argsort(rng.uniform(size=40) + np.arange(40) / 100)[:10])
        clicked = {docs[d] for r, d in enumerate(shown, 1) if rng.random() < r ** -1.0 * relevance[d]}
        answers.append(Shown("q", [docs[d] for d in shown], clicked))
    t = tally(answers, propensity.default())
    coec = np.array([t.docs[d][0] / t.docs[d][1] for d in docs])
    shown_count = {d: 0 for d in docs}
    for a in answers:
        for d in a.shown:
            shown_count[d] += 1
    raw = np.array([t.docs[d][0] / shown_count[d] for d in docs])
    examined = np.array([t.docs[d][1] for d in docs])
    assert examined.min() > 400  # every document was seen enough for the check to mean something
    assert np.abs(coec - relevance).max() < 0.08
    assert np.abs(raw - relevance).mean() > 3 * np.abs(coec - relevance).mean()


def test_smoothing_and_evidence():
    assert log_ratio(0, 0, 0.2, 10) == 0.0  # no evidence: no change
    assert log_ratio(9, 10, 0.2, 10) > 0 > log_ratio(0, 50, 0.2, 10)
    assert abs(log_ratio(1, 1, 0.2, 1000)) < abs(log_ratio(1, 1, 0.2, 1))  # more pseudo-examinations, closer to 0


def candidates(n=8):
    scores = np.linspace(5.0, 1.0, n).astype(np.float32)
    return Candidates(np.arange(n), {"retrieve": scores[::-1].copy(), "cmc": scores})


class Index:
    def ids(self, rows):
        return [f"d{r}" for r in rows]


def test_memory_moves_clicked_up_and_ignored_down():
    answers = [Shown(ClickMemory.key_of("stars"), ["d0", "d1", "d2", "d3", "d4", "d5"], {"d5"}) for _ in range(50)]
    memory = ClickMemory.build(tally(answers, propensity.default()), w_query=1.0, w_doc=0.0, pseudo=5)
    out = remembered(memory, "  stars ", candidates(), Index())  # the recorder's whitespace normalisation
    order = [f"d{r}" for r in out.rows]
    assert order.index("d5") < 5 and order.index("d0") > 0  # d5 rose from 6th; d0 (rank 1, never clicked) fell
    assert order[0] == "d5" and order[-1] == "d7"  # d7 never shown: no evidence, no boost
    score = ranked_scores(out.scores)
    assert (np.diff(score) <= 0).all()
    assert remembered(memory, "other query", candidates(), Index()).rows.tolist() == list(range(8))


def test_save_load_and_publish(tmp_path):
    answers = [Shown("k", ["a", "b"], {"b"}), Shown("k", ["b", "a"], set())]
    memory = ClickMemory.build(tally(answers, propensity.default()), 1.5, 0.5, 2.0)
    store = MemoryStore(tmp_path)
    assert store.current() is None
    for _ in range(3):
        work = store.new_work_dir()
        memory.save(work)
        live = store.publish(work)
    assert store.current() == live and live.name == "m000003"
    assert sorted(p.name for p in store.root.iterdir()) == ["CURRENT", "m000002", "m000003"]
    again = ClickMemory.load(live)
    assert again.version == "m000003" and again.pairs == memory.pairs and again.docs == memory.docs
    assert np.allclose(again.boost("k", ["a", "b", "c"]), memory.boost("k", ["a", "b", "c"]))
    assert again.boost("k", ["b"])[0] > 0 > again.boost("k", ["a"])[0]


def test_nearest_remembered_query_lends_its_clicks():
    """A query never logged whose vector is close to a remembered one's gets that query's click evidence; a far one
    gets none."""
    key = ClickMemory.key_of("do stars die")
    answers = [Shown(key, ["d0", "d1", "d2", "d3", "d4", "d5"], {"d5"}) for _ in range(50)]
    v = np.array([1.0, 0.0, 0.0], np.float32)
    memory = ClickMemory.build(tally(answers, propensity.default()), 0.0, 0.0, 5, w_near=1.0, near_min=0.9,
                               vectors={key: v})
    close, far = np.array([0.95, 0.2, 0.0]), np.array([0.5, 0.8, 0.0])
    assert memory.boost(ClickMemory.key_of("how stars end"), ["d5"], close)[0] > 0
    assert memory.boost(ClickMemory.key_of("how stars end"), ["d5"], far)[0] == 0
    assert memory.boost(key, ["d5"], v)[0] == 0  # its own clicks are the w_query term's (0 here), not a neighbour's
    order = [f"d{r}" for r in remembered(memory, "how stars end", candidates(), Index(), close).rows]
    assert order[0] == "d5"


def test_nearest_term_survives_save_and_load(tmp_path):
    key = ClickMemory.key_of("q")
    memory = ClickMemory.build(tally([Shown(key, ["a", "b"], {"b"})] * 5, propensity.default()), 0.0, 0.0, 2,
                               w_near=2.0, near_min=0.8, vectors={key: np.array([0.0, 3.0], np.float32)})
    memory.save(tmp_path)
    again = ClickMemory.load(tmp_path)
    assert again.w_near == 2.0 and again.near_keys == [key]
    probe = np.array([0.1, 1.0])
    assert np.allclose(again.boost("other", ["a", "b"], probe), memory.boost("other", ["a", "b"], probe))


def test_boost_adds_the_three_terms_per_candidate():
    """boost() against its formula, w_q f(q, d) + w_n f(nearest query, d) + w_d f(d), on random tables: documents
    in one table, several or none, the query itself remembered and the nearest other query within near_min."""
    rng = np.random.default_rng(0)
    ids = [f"d{i}" for i in range(200)]
    pairs = {"q": {d: float(rng.normal()) for d in rng.choice(ids, 30, replace=False)},
             "near": {d: float(rng.normal()) for d in rng.choice(ids + ["gone"], 40, replace=False)},
             "far": {d: float(rng.normal()) for d in rng.choice(ids, 40, replace=False)}}
    docs = {d: float(rng.normal()) for d in rng.choice(ids + ["gone"], 120, replace=False)}
    v = rng.normal(size=8).astype(np.float32)
    near = v + 0.1 * rng.normal(size=8).astype(np.float32)
    vectors = np.stack([v, near, rng.normal(size=8).astype(np.float32)])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    memory = ClickMemory(0.7, 0.3, 5.0, 0.1, pairs, docs, w_near=0.5, near_min=0.9, near_keys=["q", "near", "far"],
                         near_vectors=vectors)
    shuffled = list(rng.permutation(ids))
    got = memory.boost("q", shuffled, v)
    want = [0.7 * pairs["q"].get(d, 0) + 0.5 * pairs["near"].get(d, 0) + 0.3 * docs.get(d, 0) for d in shuffled]
    np.testing.assert_allclose(got, want)
    assert memory.boost("unknown", shuffled, v).tolist() == pytest.approx(  # nearest to an unknown query: "q"
        [0.5 * pairs["q"].get(d, 0) + 0.3 * docs.get(d, 0) for d in shuffled])
    memory.w_doc = 0.0
    assert memory.boost("q", shuffled, -v).any()  # the query's own pairs still count
    assert memory.boost("unknown", shuffled, -v).tolist() == [0.0] * len(ids)  # nothing near, no doc term


def test_the_nearest_queries_term_averages_up_to_near_k_by_cosine(tmp_path):
    """near_k = 1: the single nearest other query's f (as before near_k existed); near_k = 2: the cosine-weighted mean
    of the two nearest (a document only one of them has evidence for counts 0 for the other); below near_min: none;
    a memory saved without near_k loads as 1."""
    v = np.array([1.0, 0.0], np.float32)
    a, b, far = np.array([0.99, 0.141], np.float32), np.array([0.9, 0.436], np.float32), np.array([0.0, 1.0], np.float32)
    vectors = np.stack([a, b, far]) / np.linalg.norm(np.stack([a, b, far]), axis=1, keepdims=True)
    pairs = {"a": {"x": 2.0, "y": 1.0}, "b": {"x": -1.0, "z": 3.0}, "far": {"x": 3.0}}
    one = ClickMemory(0.0, 0.0, 5.0, 0.1, pairs, {}, w_near=1.0, near_min=0.85, near_k=1, near_keys=["a", "b", "far"],
                      near_vectors=vectors)
    assert one.nearest("new", v) == pairs["a"]
    assert one.nearest("a", v) == pairs["b"]  # never itself
    two = ClickMemory(0.0, 0.0, 5.0, 0.1, pairs, {}, w_near=1.0, near_min=0.85, near_k=2, near_keys=["a", "b", "far"],
                      near_vectors=vectors)
    sa, sb = float(vectors[0] @ v), float(vectors[1] @ v)
    got = two.nearest("new", v)
    assert got["x"] == pytest.approx((2.0 * sa - 1.0 * sb) / (sa + sb))
    assert got["y"] == pytest.approx(sa / (sa + sb)) and got["z"] == pytest.approx(3 * sb / (sa + sb))
    assert "far" not in got and two.nearest("new", np.array([-1.0, 0.0], np.float32)) == {}
    assert ClickMemory(0.0, 0.0, 5.0, 0.1, pairs, {}, w_near=1.0, near_min=0.95, near_k=2, near_keys=["a", "b", "far"],
                       near_vectors=vectors).nearest("new", v) == pairs["a"]  # only a is within 0.95
    np.testing.assert_allclose(two.boost("new", ["x", "y", "z", "w"], v), [got["x"], got["y"], got["z"], 0.0])
    two.save(tmp_path)
    assert ClickMemory.load(tmp_path).near_k == 2
    raw = json.loads((tmp_path / "memory.json").read_text())
    del raw["near_k"]
    (tmp_path / "memory.json").write_text(json.dumps(raw))
    assert ClickMemory.load(tmp_path).near_k == 1


def test_ips_dcg_ranks_targets_as_a_stable_sort_does():
    """The learners' IPS-DCG against its definition (ranks from a stable descending sort): ties among scores, several
    targets in one list, padding (-inf), a list without targets."""
    from types import SimpleNamespace

    from sieve.training.feedback_learn import ips_dcg

    rng = np.random.default_rng(1)
    scores = rng.integers(0, 6, (300, 20)).astype(np.float64)
    scores[:, 17:] = -np.inf
    targets = np.zeros_like(scores)
    targets[np.arange(300), rng.integers(0, 17, 300)] = rng.uniform(1, 4, 300)
    targets[::4, 3] += 2.0
    targets[7] = 0.0
    ranks = np.argsort(np.argsort(-scores, axis=1, kind="stable"), axis=1)
    want = (targets / np.log2(2.0 + ranks)).sum(axis=1)
    np.testing.assert_allclose(ips_dcg(scores, SimpleNamespace(targets=targets)), want, rtol=1e-12)
    assert ips_dcg(scores, SimpleNamespace(targets=np.zeros_like(scores))).tolist() == [0.0] * 300
