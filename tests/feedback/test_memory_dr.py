"""The click memory's doubly-robust estimate (`sieve feedback learn --estimate dr`, training/memory_dr.py): a candidate
no answer of its query showed is credited with a direct-method estimate of its clicks per examination, fitted on the
shown candidates, instead of only charged for what its promotion pushes down."""
from dataclasses import replace

import numpy as np
import pytest

from sieve.feedback.dataset import ClickLists
from sieve.feedback.memory import ClickMemory, Shown, tally
from sieve.training import memory_dr
from sieve.training.memory_learn import Scored, select


class Flat:
    """p(examined) = 1 at every rank."""
    source = "test"

    @staticmethod
    def of(rank: int) -> float:
        return 1.0


def scored(keys, ids, targets, base, vectors=None) -> Scored:
    q, k = np.asarray(base).shape
    lists = ClickLists(np.asarray(vectors if vectors is not None else np.ones((q, 4)), np.float32),
                       np.zeros((q, k), np.int64), np.zeros((q, k, 1), np.float32),
                       np.asarray(targets, np.float32), list(keys))
    return Scored(lists, np.asarray(base, np.float64), ids)


def test_ranks_are_a_stable_descending_sort():
    s = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0]])
    assert memory_dr.ranks(s).tolist() == [[3, 0, 1, 4, 2]]


def test_unseen_reads_each_query_on_its_first_list():
    ids = [["a", "b", "x", None], ["a", "b", "x", None], ["c", "d", "x", "e"]]
    targets = [[0, 2.0, 0, 0], [2.0, 2.0, 0, 0], [0, 0, 0, 3.0]]
    base = [[3.0, 2.0, 1.0, -np.inf]] * 2 + [[4.0, 3.0, 2.0, 1.0]]
    exposure = {"q": (4, {"a": 2.0, "b": 2.0}), "r": (3, {"c": 1.0, "d": 1.0, "e": 1.5})}
    u = memory_dr.Unseen.of(scored(["q", "q", "r"], ids, targets, base), exposure)
    assert u.first.tolist() == [0, 2] and u.answers.tolist() == [4, 3] and u.lists.tolist() == [2, 1]
    assert u.of_list.tolist() == [0, 0, 1]
    assert u.seen.tolist() == [[True, True, False, False], [True, True, False, True]]
    assert u.unseen.tolist() == [[False, False, True, False], [False, False, True, False]]  # padding is neither
    assert u.y[0].tolist() == pytest.approx([2.0 / 4, 4.0 / 4, 0, 0])  # targets summed over the lists / answers
    assert u.y[1, 3] == pytest.approx(1.0) and u.w[1].tolist() == [1.0, 1.0, 0.0, 1.5]
    assert u.lrank[1].tolist() == pytest.approx(np.log2(2.0 + np.arange(4)).tolist())


def test_the_fit_recovers_a_linear_truth_and_credits_promotions_of_unseen_candidates():
    rng = np.random.default_rng(0)
    n, k = 30, 6
    fq, fn, fd = np.zeros((n, k)), rng.uniform(-1, 2, (n, k)), rng.uniform(-1, 1, (n, k))
    base = np.sort(rng.normal(size=(n, k)), axis=1)[:, ::-1].copy()
    ids = [[f"d{i}_{j}" for j in range(k)] for i in range(n)]
    truth = 0.3 + 0.2 * fn - 0.05 * np.log2(2.0 + np.arange(k))  # clicks per examination, rank 0..k-1
    targets = np.zeros((n, k))
    targets[:, :4] = truth[:, :4]  # one answer per query, the first four shown: target = y x answers
    exposure = {f"q{i}": (1, {ids[i][j]: 1.0 for j in range(4)}) for i in range(n)}
    s = scored([f"q{i}" for i in range(n)], ids, targets, base)
    u = memory_dr.Unseen.of(s, exposure)
    beta = memory_dr.fit([u], [(fq, fn, fd)])
    r_hat = memory_dr.features(fq, fn, fd, u.lrank) @ beta
    assert r_hat == pytest.approx(truth, abs=1e-6)  # the unseen ranks 4 and 5 too (a linear truth; float32 targets)
    credit = memory_dr.Credit.of(u, beta, (fq, fn, fd), base)
    assert credit.total(0.0, 0.0, 0.0) == pytest.approx(0.0)
    # a ranking that lifts every rank-5 candidate to the top: its credit moves from 1/log2(7) to 1/log2(2)
    lifted = base.copy()
    lifted[:, 5] = 100.0
    gain = float(credit.per_query(lifted).sum()) - credit.without
    worth5 = np.clip(truth[:, 5], 0, None)
    expected = (worth5 * (1 - 1 / np.log2(7.0))).sum() + \
        (np.clip(truth[:, 4], 0, None) * (1 / np.log2(7.0) - 1 / np.log2(6.0))).sum()  # rank 4 falls to 5
    assert gain == pytest.approx(expected)
    assert memory_dr.Credit.of(u, None, (fq, fn, fd), base).total(0.0, 1.0, 0.0) == 0.0  # nothing fitted


def test_fewer_shown_pairs_than_the_fit_needs_give_no_credit():
    u = memory_dr.Unseen.of(scored(["q"], [["a", "x"]], [[1.0, 0.0]], [[1.0, 0.0]]), {"q": (1, {"a": 1.0})})
    assert memory_dr.fit([u], [(np.zeros((1, 2)),) * 3]) is None


def neighbours_world(n: int = 24):
    """n new queries, each with a remembered neighbour (the same vector) whose users clicked x_i every time and b_i in
    most answers. The new query's answers showed a_i, b_i, c_i (b_i clicked, in proportion to the neighbour's
    evidence for it), never x_i (served fourth, so the users who would click it never saw it)."""
    rng = np.random.default_rng(1)
    counted, vectors, keys, ids, targets, base, vecs, exposure = [], {}, [], [], [], [], [], {}
    for i in range(n):
        v = rng.normal(size=8).astype(np.float32)
        vectors[f"n{i}"] = v
        clicks_b = 12 + i % 6
        fillers = [f"f{i}_{j}" for j in range(4)]  # shown to the neighbour's users, never clicked
        counted += [Shown(f"n{i}", [f"x{i}", f"b{i}"] + fillers, {f"x{i}", f"b{i}"} if j < clicks_b else {f"x{i}"})
                    for j in range(20)]
        order = [[f"b{i}", f"a{i}", f"c{i}"], [f"a{i}", f"b{i}", f"c{i}"], [f"a{i}", f"c{i}", f"b{i}"]][i % 3]
        row = order + [f"x{i}"]
        keys.append(f"q{i}"), ids.append(row), vecs.append(v)
        t = np.zeros(4)
        t[row.index(f"b{i}")] = clicks_b / 20.0
        targets.append(t), base.append([3.0, 2.0, 1.0, 0.0])
        exposure[f"q{i}"] = (1, {d: 1.0 for d in order})
    return counted, vectors, scored(keys, ids, targets, base, np.stack(vecs)), exposure


def test_selection_with_the_direct_method_promotes_what_similar_users_clicked_and_nobody_here_saw():
    counted, vectors, judged, exposure = neighbours_world()
    ips, _ = select([(counted, judged)], Flat(), 0.25, vectors)
    dr, grid = select([(counted, judged)], Flat(), 0.25, vectors, exposure=exposure)

    def x_above_b(choice) -> int:
        memory = ClickMemory.build(tally(counted, Flat()), choice["w_query"], choice["w_doc"], choice["pseudo"],
                                   w_near=choice["w_near"], near_min=choice["near_min"], vectors=vectors,
                                   near_k=choice["near_k"], doc_related=choice["doc_related"])
        fq, fn, fd = judged.terms(memory)
        s = judged.base + memory.w_query * fq + memory.w_near * fn + memory.w_doc * fd
        return int((s[:, 3] > s[np.arange(len(s)), [row.index(f"b{i}") for i, row in enumerate(judged.ids)]]).sum())

    assert ips["w_near"] + ips["w_doc"] > 0  # IPS too lifts b above a where the neighbour clicked it
    assert x_above_b(dr) > x_above_b(ips)  # but only DR lifts x, which IPS can only charge
    assert grid[1]["validation_ips_dcg"] > grid[0]["no_memory_validation_ips_dcg"]


def test_the_guard_credits_each_answer_its_share_of_its_query():
    """The guard's estimate over every candidate (guard_support "both") adds the credit per held-out answer: a query's
    credit spread evenly over its clicked answers, which the bootstrap resamples."""
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.memory_learn import Fitting

    counted, vectors, judged, exposure = neighbours_world()
    twice = scored(judged.lists.keys * 2, judged.ids * 2, np.concatenate([judged.lists.targets] * 2),
                   np.concatenate([judged.base] * 2), np.concatenate([judged.lists.query_vectors] * 2))
    memory = ClickMemory.build(tally(counted, Flat()), 0.0, 8.0, 50.0, w_near=8.0, near_min=0.8, vectors=vectors)
    work = Fitting(LearnConfig(estimate="dr"), Flat(), None, None, None, 100.0, exposure, vectors)
    once = work.credit(judged, memory)
    assert (once > 0).all()  # x_i lifted for every query, and users like these clicked documents like it
    doubled = {k: (2 * n, {d: 2 * e for d, e in exams.items()}) for k, (n, exams) in exposure.items()}
    spread = replace(work, exposure=doubled).credit(twice, memory)  # two answers per query, both clicked alike
    assert spread.tolist() == pytest.approx(np.concatenate([once, once]).tolist())
    nothing = ClickMemory.build(tally(counted, Flat()), 0.0, 0.0, 50.0, vectors=vectors)
    assert work.credit(judged, nothing).tolist() == pytest.approx([0.0] * len(once))


def test_the_guard_refuses_what_the_doubly_robust_estimate_puts_below_the_served_ranking():
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.memory_learn import memory_verdict

    cfg = LearnConfig()
    assert cfg.estimate == "dr" and cfg.guard_support == "both"
    passed = {"heldout_answers": 400, "delta": 0.018, "interval": [0.010, 0.025]}
    level = {"heldout_answers": 400, "delta": 0.0, "interval": [-0.01, 0.01], "estimate": "dr"}
    assert memory_verdict({**passed, "charged": level}, cfg) is None
    assert memory_verdict({**passed, "charged": {**level, "delta": -0.0003, "interval": [-0.0097, 0.0079]}}, cfg) is None
    refused = memory_verdict({**passed, "charged": {**level, "delta": -0.02, "interval": [-0.03, -0.01]}}, cfg)
    assert "doubly robust" in refused and "-0.02" in refused


def test_the_command_takes_the_estimate():
    import argparse

    from sieve.training.feedback_cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["feedback", "learn"]).estimate == "dr"
    assert parser.parse_args(["feedback", "learn", "--estimate", "ips"]).estimate == "ips"
    with pytest.raises(SystemExit):
        parser.parse_args(["feedback", "learn", "--estimate", "snips"])


def test_the_command_refuses_the_estimate_with_a_support_that_leaves_out_what_it_credits(tmp_path):
    import argparse

    from sieve.service.config import Settings
    from sieve.training.feedback_cli import learn, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["feedback", "learn", "--support", "shown"])
    with pytest.raises(SystemExit, match="add --estimate ips"):
        learn(args, Settings(index_dir=tmp_path))
