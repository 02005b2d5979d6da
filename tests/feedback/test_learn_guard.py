"""The learner and its guard on the demo index, with the shipped fusion CMC as the served model: a model trained on
adversarial clicks (always the lowest shown document that is not the query's own) is refused on held-out genuine
feedback, with a negative counterfactual estimate; one trained on genuine clicks estimates better than it; too little
held-out feedback is refused whatever the estimate."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sieve.feedback import propensity
from sieve.feedback.dataset import Entry, build
from sieve.index import build_index, read_beir_corpus
from tests.conftest import DEMO_CORPUS

SHOWN = 10


@pytest.fixture(scope="module")
def world(biencoder, cache_dir, tmp_path_factory):
    import torch

    from sieve import checkpoints
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.service.config import Settings
    from sieve.service.runtime import load_index

    path = tmp_path_factory.mktemp("demo-index")
    docs = read_beir_corpus(DEMO_CORPUS)
    build_index(docs, biencoder, path, cache_dir=cache_dir, progress=False)
    index = load_index(Settings(index_dir=path), biencoder, torch.device("cpu"))
    served = load_cmc(checkpoints.CMC, biencoder).model.float().eval()
    queries = biencoder.encode_queries([d.title for d in docs]).float().numpy()
    yield index, served, docs, queries
    index.close()


def entries(docs, queries, index, adversarial: bool, sessions: int, seed: int) -> list[Entry]:
    rng = np.random.default_rng(seed)
    vectors = index.embeddings(np.arange(index.size))
    ids = index.ids(np.arange(index.size))
    props = propensity.default()
    out = []
    for s in range(sessions):
        i = s % len(docs)
        be = vectors @ queries[i]
        order = np.argsort(-be)
        cand = [ids[j] for j in order]
        shown = cand[:SHOWN]
        if adversarial:
            clicked = next(d for d in reversed(shown) if d != docs[i].id)
        else:
            clicked = docs[i].id if docs[i].id in shown and rng.random() < props.of(shown.index(docs[i].id) + 1) else None
        if clicked is None:
            continue
        rank = shown.index(clicked) + 1
        out.append(Entry(f"q{i}", queries[i], cand, be[order].astype(np.float32), np.zeros(len(cand), np.float32),
                         {clicked: 1.0 / props.of(rank)}, {clicked: rank}))
    return out


def learned(world, adversarial: bool):
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.feedback_learn import Vectors, guard, split, train

    index, served, docs, queries = world
    # no attention layer (the fusion of the evidence alone learns): seconds on a loaded 2-core machine
    cfg = LearnConfig(depth=30, n_layers=0, steps=60, batch=16, eval_every=10, lr=1e-2, evidence_lr=1e-2,
                      teacher=0.1, min_heldout=20)
    lists, _ = build(entries(docs, queries, index, adversarial, 600, seed=1), index, cfg.depth)
    genuine, _ = build(entries(docs, queries, index, False, 600, seed=2), index, cfg.depth)
    fit, validation = split(lists, 0.2, cfg.seed)
    vectors = Vectors(index, lists, genuine)
    model, record = train(cfg, fit, validation, served, vectors, log=lambda _: None)
    return guard(model, served, genuine, vectors, cfg), record, cfg


def test_the_guard_refuses_a_model_trained_on_adversarial_clicks(world):
    from sieve.training.feedback_learn import verdict

    bad, record, cfg = learned(world, adversarial=True)
    assert record["best_step"] > 0  # it did learn the adversarial clicks (else the refusal would be trivial)
    assert bad["delta"] < 0 and bad["interval"][0] < 0
    assert "not better than the served model" in verdict(bad, record["best_step"], cfg)
    good, _, _ = learned(world, adversarial=False)
    assert good["delta"] > bad["delta"]


def test_too_little_heldout_feedback_is_refused():
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.feedback_learn import verdict

    report = {"heldout_answers": 12, "delta": 0.5, "interval": [0.4, 0.6]}
    assert "too little held-out feedback" in verdict(report, 100, LearnConfig(min_heldout=50))
    assert verdict({**report, "heldout_answers": 50}, 100, LearnConfig(min_heldout=50)) is None


def logs_of(docs, queries, index, adversarial_until: int, sessions: int, seed: int, wanted_rank: int | None = None):
    """Logged answers (impressions + click events) of title queries: before session `adversarial_until` the user
    clicks the lowest shown document that is not the wanted one; from it on, the wanted one when shown and examined
    ((1/rank)^1). The wanted document: the query's own, or (`wanted_rank`) the one the bi-encoder ranks there."""
    from sieve.feedback.dataset import Logs
    from sieve.feedback.memory import ClickMemory
    from sieve.feedback.records import pack

    rng = np.random.default_rng(seed)
    vectors = index.embeddings(np.arange(index.size))
    ids = index.ids(np.arange(index.size))
    impressions, events = {}, []
    for s in range(sessions):
        i = s % len(docs)
        be = vectors @ queries[i]
        order = np.argsort(-be)[:30]
        shown = [ids[j] for j in order[:SHOWN]]
        wanted = docs[i].id if wanted_rank is None else shown[wanted_rank - 1]
        rid = f"r{s}"
        impressions[rid] = {"request_id": rid, "t": float(s), "endpoint": "/search", "swap": None,
                            "query_key": ClickMemory.key_of(docs[i].title), "shown": shown,
                            "candidates": [ids[j] for j in order], "vector": pack(queries[i]),
                            "be": pack(be[order]), "bm25": pack(np.zeros(len(order)))}
        if s < adversarial_until:
            clicked = next(d for d in reversed(shown) if d != wanted)
        elif wanted in shown and rng.random() < 1 / (shown.index(wanted) + 1):
            clicked = wanted
        else:
            continue
        events.append({"request_id": rid, "doc_id": clicked, "type": "click"})
    return Logs(impressions, events)


def memory_learned(world, adversarial_until: int, served_memory=None, sessions: int = 900,
                   wanted_rank: int | None = None):
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.feedback_learn import Vectors, scores_of
    from sieve.training.memory_learn import learn_memory

    index, served, docs, queries = world
    cfg = LearnConfig(depth=30, split="time", min_heldout=20)
    logs = logs_of(docs, queries, index, adversarial_until, sessions, seed=3, wanted_rank=wanted_rank)
    return learn_memory(cfg, logs, propensity.default(), index,
                        lambda lists: scores_of(served, lists, Vectors(index, lists)), served_memory, 20.0)


def test_the_guard_refuses_a_click_memory_built_from_adversarial_clicks(world):
    """The first 80% of answers (the memory's fit and validation) are adversarial, the held-out latest 20% genuine:
    the memory learned the adversarial clicks (weights chosen on validation) and is refused on held-out feedback."""
    bad, report = memory_learned(world, adversarial_until=720)
    assert bad is None
    assert report["chosen"]["w_query"] > 0 or report["chosen"]["w_doc"] > 0  # it learned them: not a trivial refusal
    assert report["guard"]["heldout_answers"] >= 20
    assert report["guard"]["delta"] < 0 and report["guard"]["interval"][0] < 0
    assert report["guard"]["charged"]["delta"] < 0  # the default guard ("both") also ranks every candidate
    assert "not better than the served model" in report["not_installed"]
    good, good_report = memory_learned(world, adversarial_until=0)
    assert good_report["guard"]["delta"] > report["guard"]["delta"]


def test_a_memory_update_is_judged_against_no_memory_and_the_served_one(world):
    """With a memory served, an update built from genuine clicks is published when it clearly beats the ranking
    without a memory and is not below the served one; one built from adversarial clicks is refused on both counts.
    The users want the document the bi-encoder ranks third (so a memory has something to move)."""
    first, _ = memory_learned(world, adversarial_until=0, sessions=450, wanted_rank=3)
    assert first is not None
    good, report = memory_learned(world, adversarial_until=0, served_memory=first, wanted_rank=3)
    guard = report["guard"]
    assert guard["vs_no_memory"]["interval"][0] > 0 and guard["delta"] >= 0
    assert good is not None, report.get("not_installed")
    # the first half adversarial: the held-out latest 20% of clicked answers are all genuine
    bad, bad_report = memory_learned(world, adversarial_until=450, served_memory=first, wanted_rank=3)
    assert bad is None
    assert bad_report["guard"]["delta"] < 0 and bad_report["guard"]["vs_no_memory"]["delta"] < 0
    assert "not better than the ranking without a click memory" in bad_report["not_installed"]


def test_the_memory_update_rule():
    """An update clearly better than no memory but only level with the served one (the estimate that favours what
    is served) is published; below the served one, or not clearly better than none, it is refused; a first memory
    keeps the strict rule."""
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.memory_learn import memory_verdict

    cfg = LearnConfig(min_heldout=50)
    level = {"heldout_answers": 440, "delta": 0.005, "interval": [-0.021, 0.034],
             "vs_no_memory": {"heldout_answers": 440, "delta": 0.138, "interval": [0.102, 0.173]}}
    assert memory_verdict(level, cfg) is None
    assert "below the served click memory" in memory_verdict({**level, "delta": -0.001}, cfg)
    unclear = {**level, "vs_no_memory": {**level["vs_no_memory"], "interval": [-0.01, 0.2]}}
    assert "without a click memory" in memory_verdict(unclear, cfg)
    assert "too little held-out feedback" in memory_verdict({**level, "heldout_answers": 49}, cfg)
    first = {k: v for k, v in level.items() if k != "vs_no_memory"}
    assert "not better than the served model" in memory_verdict(first, cfg)
    assert memory_verdict({**first, "interval": [0.001, 0.03]}, cfg) is None
    # the cross-fitted guard publishing fold 0's memory: it must also not be below on its own fold's answers
    fold = LearnConfig(min_heldout=50, memory_publish="fold")
    own = {"fold": 0, "answers": 90, "delta": 0.002, "vs_no_memory": 0.1}
    below, unclear_own = {**own, "delta": -0.001}, {**own, "vs_no_memory": -0.01}
    nothing = {"fold": 0, "answers": 0, "delta": None}
    assert memory_verdict({**level, "published_fold": own}, fold) is None
    assert "below the ranking served on its own" in memory_verdict({**level, "published_fold": below}, fold)
    assert "without a click memory on its own" in memory_verdict({**level, "published_fold": unclear_own}, fold)
    assert "on its own" in memory_verdict({**first, "interval": [0.001, 0.03], "published_fold": nothing}, fold)
    # refit (the default) publishes a memory made from every answer: the pooled folds decide, fold 0's alone does not
    assert cfg.memory_publish == "refit"
    for own_fold in (own, below, unclear_own, nothing):
        assert memory_verdict({**level, "published_fold": own_fold}, cfg) is None
        assert "not better than the served model" in memory_verdict({**first, "published_fold": own_fold}, cfg)


def test_selection_folds_judge_each_query_with_a_memory_counted_without_it():
    """Split by query, the memory's weights are chosen fold by fold: every clicked answer that is not held out is
    judged (up to memory_select_answers, whole queries) by a memory counted from the other folds' answers only; a
    held-out answer is never judged nor counted; a query stays in its fold in every run; split by time, one fold
    (fit -> validation) as before."""
    from types import SimpleNamespace

    from sieve.feedback.memory import Shown
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.memory_learn import fold_of, selection_folds, side

    cfg = LearnConfig(split="query")
    keys = [f"q{i}" for i in range(400)]
    answers = [Shown(k, ["a", "b"], {"a"}, float(i)) for i, k in enumerate(keys * 2)]
    entries = [SimpleNamespace(key=a.key, t=a.t) for a in answers]
    parts = {"fit": [], "validation": [], "heldout": []}
    for a in answers:
        parts[side(a.key, a.t, None, None, cfg)].append(a)
    folds = selection_folds(cfg, parts, entries, None, None, lambda judged: judged)
    assert len(folds) == cfg.memory_folds
    judged_keys = [{e.key for e in judged} for _, judged in folds]
    held = {a.key for a in parts["heldout"]}
    assert held and not held & set().union(*judged_keys)
    assert set().union(*judged_keys) == {a.key for a in parts["fit"] + parts["validation"]}  # all, under the cap
    for (counted, _), mine in zip(folds, judged_keys):
        assert mine and not mine & {a.key for a in counted} and not held & {a.key for a in counted}
        assert len(counted) + 2 * len(mine) == len(parts["fit"]) + len(parts["validation"])
    assert all(fold_of(k, cfg) == fold_of(k, LearnConfig()) for k in keys)
    capped = selection_folds(LearnConfig(split="query", memory_select_answers=100), parts, entries, None, None,
                             lambda judged: judged)
    n = sum(len(judged) for _, judged in capped)
    assert 40 <= n <= 200 and n % 2 == 0  # about the cap, whole queries (each query answered twice)
    few = selection_folds(LearnConfig(split="query", memory_select_answers=0), parts, entries, None, None,
                          lambda judged: judged)
    assert len(few) == 1 and few[0][0] == parts["fit"]  # none drawn under the cap: the single validation share
    assert {e.key for e in few[0][1]} == {a.key for a in parts["validation"]}
    timed = LearnConfig(split="time")
    one = selection_folds(timed, {"fit": answers[:10], "validation": [], "heldout": []}, entries[:20], 0.0, 0.0,
                          lambda judged: judged)
    assert len(one) == 1 and one[0][0] == answers[:10]


def test_the_crossfit_guard_folds_cover_every_query_once():
    """The cross-fitted guard's folds: fold 0 is the default guard's held-out share, every query in exactly one fold,
    each about the held-out share's size; judging fold g, the selection's inner folds cut the other queries evenly,
    and for fold 0 they are the held-out guard's own (fold_of), so the memory published is the one it would judge."""
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.memory_learn import fold_of, guard_fold, guard_folds, inner_fold, side

    cfg = LearnConfig(split="query", memory_guard="crossfit")
    keys = [f"q{i}" for i in range(3000)]
    folds = np.array([guard_fold(k, cfg) for k in keys])
    assert guard_folds(cfg) == 5 and set(folds) == set(range(5))
    assert all((f == 0) == (side(k, 0.0, None, None, cfg) == "heldout") for k, f in zip(keys, folds))
    sizes = np.bincount(folds)
    assert sizes.min() > 0.15 * len(keys) and sizes.max() < 0.25 * len(keys)
    for g in range(5):
        inner = np.array([inner_fold(k, g, cfg) for k in keys])[folds != g]
        counts = np.bincount(inner, minlength=cfg.memory_folds)
        assert counts.min() > 0.7 * counts.mean()  # about even
    assert all(inner_fold(k, 0, cfg) == fold_of(k, cfg) for k in np.array(keys)[folds != 0])


def test_the_automatic_guard_is_cross_fitted_on_logs_up_to_its_size():
    """memory_guard "auto" (the default): cross-fitted up to crossfit_max_answers clicked answers, held out above
    (where one share has answers enough and five selections would cost minutes); never split by time."""
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.memory_learn import cross_fitted

    auto = LearnConfig()
    assert auto.memory_guard == "auto" and auto.split == "query"
    assert cross_fitted(auto, auto.crossfit_max_answers) and not cross_fitted(auto, auto.crossfit_max_answers + 1)
    assert cross_fitted(LearnConfig(memory_guard="crossfit"), 10 ** 7)
    assert not cross_fitted(LearnConfig(memory_guard="heldout"), 10)
    assert not cross_fitted(LearnConfig(split="time"), 10)


def variant_logs(docs, queries, index, sessions: int, seed: int, adversarial=lambda key: False):
    """Answers to two phrasings of each title query (two query keys, one vector: the near term carries one's clicks
    to the other, whichever fold each is in); the users want the document the bi-encoder ranks third and click it
    when examined ((1/rank)^1); those of a query key `adversarial` says click the lowest shown document that is not
    it, every time."""
    from sieve.feedback.dataset import Logs
    from sieve.feedback.memory import ClickMemory
    from sieve.feedback.records import pack

    rng = np.random.default_rng(seed)
    vectors = index.embeddings(np.arange(index.size))
    ids = index.ids(np.arange(index.size))
    impressions, events = {}, []
    for s in range(sessions):
        i, variant = s % len(docs), (s // len(docs)) % 2
        be = vectors @ queries[i]
        order = np.argsort(-be)[:30]
        shown = [ids[j] for j in order[:SHOWN]]
        wanted = shown[2]
        rid = f"r{s}"
        key = ClickMemory.key_of(docs[i].title + (" (reworded)" if variant else ""))
        impressions[rid] = {"request_id": rid, "t": float(s), "endpoint": "/search", "swap": None,
                            "query_key": key, "shown": shown, "candidates": [ids[j] for j in order],
                            "vector": pack(queries[i]), "be": pack(be[order]), "bm25": pack(np.zeros(len(order)))}
        if adversarial(key):
            events.append({"request_id": rid, "doc_id": next(d for d in reversed(shown) if d != wanted),
                           "type": "click"})
        elif rng.random() < 1 / 3:
            events.append({"request_id": rid, "doc_id": wanted, "type": "click"})
    return Logs(impressions, events)


@pytest.fixture(scope="module")
def crossfit_reworded(world):
    """(index, config, logs, scorer, memory, report) of the cross-fitted guard's tests: split by query, the first
    share's memory published (`fold`), clicks on reworded queries (variant_logs, seed 4); memory and report are that
    configuration's learn, made once for the tests that read it."""
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.feedback_learn import Vectors, scores_of
    from sieve.training.memory_learn import learn_memory

    index, served, docs, queries = world
    cfg = LearnConfig(depth=30, split="query", memory_guard="crossfit", min_heldout=20, noise="off",
                      memory_publish="fold")
    logs = variant_logs(docs, queries, index, 1800, seed=4)
    score = lambda lists: scores_of(served, lists, Vectors(index, lists))  # noqa: E731
    memory, report = learn_memory(cfg, logs, propensity.default(), index, score, None, 20.0)
    return index, cfg, logs, score, memory, report


@pytest.fixture(scope="module")
def adversarial_elsewhere(world, crossfit_reworded):
    """(config, logs, memory, report): the users of the cross-fitted guard's held-out share (fold 0) want the
    document ranked third, every other user clicks the lowest shown one (variant_logs, seed 5); crossfit_reworded's
    configuration and scorer (fold 0's memory published, `fold`), learned once for the tests that read it."""
    from sieve.training.memory_learn import guard_fold, learn_memory

    _, _, docs, queries = world
    index, cfg, _, score, _, _ = crossfit_reworded
    logs = variant_logs(docs, queries, index, 1800, seed=5, adversarial=lambda key: guard_fold(key, cfg) != 0)
    memory, report = learn_memory(cfg, logs, propensity.default(), index, score, None, 20.0)
    return cfg, logs, memory, report


def test_the_crossfit_guard_judges_every_clicked_answer(crossfit_reworded):
    """Split by query with the cross-fitted guard, every clicked answer is judged once, by a memory counted without
    its query's answers (the verdict is memory_verdict's, as for the held-out guard: the adversarial tests above):
    clicks on reworded queries are published (the near term carries them to the other phrasing), every fold's
    answers pooled; the memory published is the one the held-out guard judges (the same weights), on an interval
    that is narrower."""
    from sieve.training.memory_learn import learn_memory

    index, cfg, logs, score, memory, report = crossfit_reworded
    guard = report["guard"]
    clicked = len(logs.entries(propensity.default(), 20.0)[0])
    assert guard["kind"] == "crossfit"
    assert guard["heldout_answers"] == clicked == sum(f["answers"] for f in guard["crossfit_folds"])
    assert len(guard["crossfit_folds"]) == 5
    assert memory is not None, report.get("not_installed")
    assert guard["interval"][0] > 0 and memory.w_near > 0
    held_memory, held_report = learn_memory(dataclasses.replace(cfg, memory_guard="heldout"), logs,
                                            propensity.default(), index, score, None, 20.0)
    assert held_report["guard"]["kind"] == "heldout"
    assert held_report["chosen"] == report["chosen"] and held_memory.about["answers"] == memory.about["answers"]
    assert held_report["guard"]["heldout_answers"] == guard["crossfit_folds"][0]["answers"]
    width = lambda g: g["interval"][1] - g["interval"][0]  # noqa: E731
    assert width(guard) < width(held_report["guard"])


def test_the_refit_publishes_the_judged_procedure_counted_from_every_answer(crossfit_reworded,
                                                                           adversarial_elsewhere):
    """--memory-publish refit (the default): the cross-fitted guard judges the procedure as before (the same folds,
    the same interval), and the memory published is that procedure applied to every answer: the held-out share's
    queries are remembered too, where fold 0's memory cannot know them. Fold 0's own estimate does not decide (no
    fold's memory is the one published): where the held-out share's users want other documents than everyone
    else's, `fold` is refused and the refit, which counts their clicks too, is published on the same pooled
    interval (test_the_memory_update_rule: what that interval refuses, refit or not)."""
    from sieve.training.memory_learn import guard_fold, learn_memory

    index, cfg, logs, score, fold, fold_report = crossfit_reworded
    refit = dataclasses.replace(cfg, memory_publish="refit")
    refitted, report = learn_memory(refit, logs, propensity.default(), index, score, None, 20.0)
    assert fold is not None and refitted is not None, report.get("not_installed")
    assert report["guard"] == fold_report["guard"]
    assert report["published"] == refitted.about["published"] == "refit on every answer"
    assert report["judged_fold_chosen"] == fold_report["chosen"] and "published" not in fold_report
    assert refitted.about["answers"] == len(logs.answers()) > fold.about["answers"]
    held_out = {key for key in refitted.pairs if guard_fold(key, cfg) == 0}
    assert held_out and not held_out & set(fold.pairs)
    assert refitted.w_near > 0

    fold_cfg, elsewhere, refused_fold, refused_fold_report = adversarial_elsewhere
    assert refused_fold is None and dataclasses.replace(fold_cfg, memory_publish="refit") == refit
    published, published_report = learn_memory(refit, elsewhere, propensity.default(), index, score, None, 20.0)
    assert published_report["guard"] == refused_fold_report["guard"]
    assert published_report["guard"]["published_fold"]["delta"] < 0 < published_report["guard"]["interval"][0]
    assert published is not None, published_report.get("not_installed")
    assert {key for key in published.pairs if guard_fold(key, cfg) == 0}  # the held-out share's users count too


def test_the_crossfit_guard_selects_on_one_inner_fold_when_the_cap_draws_no_query(world):
    """With a selection cap that draws no query (memory_select_answers 0), each fold's memory is selected on one
    inner fold of the other queries instead, and every clicked answer is still judged."""
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.feedback_learn import Vectors, scores_of
    from sieve.training.memory_learn import learn_memory

    index, served, docs, queries = world
    cfg = LearnConfig(depth=30, split="query", memory_guard="crossfit", min_heldout=20, noise="off",
                      memory_select_answers=0)
    logs = variant_logs(docs, queries, index, 900, seed=6)
    _, report = learn_memory(cfg, logs, propensity.default(), index,
                             lambda lists: scores_of(served, lists, Vectors(index, lists)), None, 20.0)
    assert report["guard"]["kind"] == "crossfit" and len(report["guard"]["crossfit_folds"]) == 5
    assert report["guard"]["heldout_answers"] == len(logs.entries(propensity.default(), 20.0)[0])
    assert report["grid"][0]["folds"] == 1


def test_the_crossfit_guard_refuses_a_memory_its_own_heldout_answers_judge_worse(adversarial_elsewhere):
    """With `--memory-publish fold`: the users of the held-out share's queries (guard fold 0) want the document
    ranked third, every other user clicks the lowest shown one: the memory to publish (counted from the other folds)
    learned those clicks and is refused on its own held-out answers, though the memories made the same way for the other folds agree with
    theirs (the pooled estimate alone would publish it)."""
    _, _, memory, report = adversarial_elsewhere
    guard = report["guard"]
    assert memory is None
    assert report["chosen"]["w_near"] > 0 or report["chosen"]["w_doc"] > 0  # it learned them: not a trivial refusal
    assert guard["published_fold"]["delta"] < 0 < guard["interval"][0]
    assert "on its own held-out answers" in report["not_installed"]
