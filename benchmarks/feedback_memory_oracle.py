"""How well the click memory's selection picks its weights (issue 33, RESULTS.md "Eighteenth session"): for every
configuration of a grid, the click estimate `sieve feedback learn` selects on (the mean IPS-DCG difference against
no memory over the validation folds' clicked answers, exactly as memory_learn.select computes it) beside what that
configuration, counted as the learner would publish it (fit + validation answers), gives on an evaluation split's
nDCG@10 offline (feedback_memory_offline.py's served lists). The best configuration on the evaluation split is an
oracle, not a learner: it says how much of the gap to a target is the counts and how much the choice. With
`--judged-counts` each configuration is also counted from the same answers as the full-information ceiling counts
them (feedback_sim.py --ceiling: every shown document examined, clicked exactly when the train qrels judge it
relevant) and scored on the evaluation split (`eval_gain_judged`): what those weights give from perfect clicks.

Use the dev split: the evaluation split here is chosen on, so the test split would be selected on too.

    .venv/bin/python benchmarks/feedback_memory_oracle.py --index /tmp/nf20k/nfcorpus-train-test/index \
        --data ../shared/data/nfcorpus --split dev --cache /tmp/nf-dev-cands.pkl --out /tmp/oracle.json
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import feedback_memory_offline as offline  # noqa: E402
from sieve.evaluation.dataset import load_split  # noqa: E402

NEAR = ((0.7, 1), (0.7, 8), (0.8, 1), (0.8, 8), (0.9, 1))  # (near_min, near_k)


def grid(index: Path, lists: dict, data, heldout: float, propensities: str = "policy",
         clip: float | None = None, support: dict | None = None, learner_grid: bool = False, judged_by=None
         ) -> tuple[list[dict], dict]:
    """`support`: LearnConfig's support fields (feedback_memory_offline.support_kwargs), the learner's when empty.
    `learner_grid`: the learner's own grid (every weight of W_GRID, its near_min and near_k grids) instead of NEAR
    and the weights up to 16 score units. `judged_by`: the train split (its qrels judge the shown documents: the
    ceiling's counts, `eval_gain_judged`)."""
    from sieve.feedback.memory import ClickMemory, tally
    from sieve.training import memory_learn
    from sieve.training.feedback_learn import ips_dcg

    W = memory_learn.W_GRID if learner_grid else memory_learn.W_GRID[:8]  # x the score unit
    near_grid = [(n, k) for n in memory_learn.NEAR_GRID for k in memory_learn.NEAR_K_GRID] if learner_grid else NEAR
    seen = {}
    learn, select = memory_learn.learn_memory, memory_learn.select

    def capture_learn(cfg, logs, *rest):  # the logs and settings the learner reads
        seen.update(cfg=cfg, logs=logs)
        return learn(cfg, logs, *rest)

    def capture_select(folds, props, unit, vectors, *rest):  # its folds, propensities, score unit and query vectors
        if "folds" not in seen:  # the first selection: the published memory's (the cross-fitted guard selects again
            seen.update(folds=folds, props=props, unit=unit, vectors=vectors)  # for each other share after it)
        return select(folds, props, unit, vectors, *rest)

    memory_learn.learn_memory, memory_learn.select = capture_learn, capture_select
    try:
        _, report = offline.learned(index, {"heldout": heldout, "propensities": propensities, **(support or {})},
                                    clip)
    finally:
        memory_learn.learn_memory, memory_learn.select = learn, select
    folds, props, unit, vectors, cfg = (seen[k] for k in ("folds", "props", "unit", "vectors", "cfg"))
    judged = [s for _, s in folds]
    none = np.concatenate([s.none() for s in judged])
    cuts = np.cumsum([len(s.lists) for s in judged])[:-1]  # where each selection fold's answers end in `none`
    bases = [s.judged(s.base) for s in judged]  # the learner's estimate: -inf off its support
    answers = seen["logs"].answers()
    held_from, val_from = memory_learn.time_cuts(answers, cfg)
    # the fit and validation answers: what the learner counts the memory it publishes from
    kept = [a for a in answers if memory_learn.side(a.key, a.t, held_from, val_from, cfg) != "heldout"]
    published = tally(kept, props)
    judged_counts = ceiling_counts(kept, judged_by) if judged_by is not None else None
    base = float(np.mean(list(offline.ndcgs(lists, data).values())))
    rows = []
    for m in memory_learn.PSEUDO_GRID:
        counted = [ClickMemory.build(tally(c, props), 1.0, 1.0, m, w_near=1.0, vectors=vectors) for c, _ in folds]
        memory = ClickMemory.build(published, 0.0, 1.0, m, w_near=1.0, vectors=vectors)
        perfect = ClickMemory.build(judged_counts, 0.0, 1.0, m, w_near=1.0, vectors=vectors) \
            if judged_counts is not None else None
        for near_min, near_k in near_grid:
            terms = [s.terms(replace(c, near_min=near_min, near_k=near_k)) for c, s in zip(counted, judged)]
            memory.near_min, memory.near_k = near_min, near_k
            for wd, wn in itertools.product(W, W):
                if not (wd or wn) or (not wn and (near_min, near_k) != near_grid[-1]):
                    continue
                diff = np.concatenate([ips_dcg(b + unit * (wn * fn + wd * fd), s.lists)
                                       for s, b, (_, fn, fd) in zip(judged, bases, terms)]) - none
                memory.w_doc, memory.w_near = wd * unit, wn * unit
                gain = float(np.mean(list(offline.ndcgs(lists, data, memory).values()))) - base
                rows.append({"pseudo": m, "near_min": near_min, "near_k": near_k, "w_doc": wd, "w_near": wn,
                             "click_estimate": round(float(diff.mean()), 5), "eval_gain": round(gain, 4),
                             "fold_estimates": [round(float(x.mean()), 5) for x in np.split(diff, cuts)]})
                if perfect is not None:
                    perfect.near_min, perfect.near_k, perfect.w_doc, perfect.w_near = \
                        near_min, near_k, wd * unit, wn * unit
                    rows[-1]["eval_gain_judged"] = round(
                        float(np.mean(list(offline.ndcgs(lists, data, perfect).values()))) - base, 4)
    return rows, {"chosen": report.get("chosen"), "verdict": report.get("verdict"), "score_unit": unit,
                  "validation_answers": int(len(none)), "default": round(base, 4)}


def ceiling_counts(answers: list, train):
    """`answers` counted as feedback_sim.py's ceiling counts them: each shown document examined (propensity 1, its
    `--eta 0`), clicked exactly when the train split's qrels judge it relevant for the answer's query."""
    from benchmarks.feedback_sim import relevant_by_key
    from sieve.feedback import propensity
    from sieve.feedback.memory import Shown, tally

    relevant = relevant_by_key(train)
    return tally([Shown(a.key, a.shown, {d for d in a.shown if d in relevant.get(a.key, ())}, a.t) for a in answers],
                 propensity.default(eta=0.0))


def spearman(x, y) -> float:
    """Rank correlation (ties share their mean rank)."""
    def ranks(v):
        v = np.asarray(v, np.float64)
        r = np.empty(len(v))
        r[np.argsort(v, kind="stable")] = np.arange(len(v))
        _, group = np.unique(v, return_inverse=True)
        return (np.bincount(group, r) / np.bincount(group))[group]
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def selection_rules(rows: list[dict]) -> dict:
    """What other rules would choose from the same click estimates (each configuration's per-fold means), beside the
    learner's (the best mean): the best worst fold (maximin), the best median fold, the best mean rank over folds,
    and the best mean less one standard error across folds (a cautious choice; RESULTS.md, twenty-third session,
    tried a one-standard-error rule in the learner). Each with its configuration's gain on the evaluation split."""
    folds = np.array([r["fold_estimates"] for r in rows])  # (configurations, folds)
    mean = np.array([r["click_estimate"] for r in rows])
    ranks = np.argsort(np.argsort(-folds, axis=0), axis=0)  # per fold, 0 = the best configuration
    se = folds.std(axis=1, ddof=1) / np.sqrt(folds.shape[1]) if folds.shape[1] > 1 else np.zeros(len(rows))
    picks = {"best_mean (the learner's rule)": int(mean.argmax()), "maximin_fold": int(folds.min(axis=1).argmax()),
             "median_fold": int(np.median(folds, axis=1).argmax()), "mean_rank": int(ranks.mean(axis=1).argmin()),
             "mean_less_one_se": int((folds.mean(axis=1) - se).argmax())}
    return {name: rows[i] for name, i in picks.items()}


def main() -> None:
    from sieve.evaluation.report import machine_info

    ap = offline.run_arguments(__doc__)
    ap.add_argument("--learner-grid", action="store_true", help="the learner's own grid (every weight up to 128 "
                    "score units, its near_min and near_k grids) instead of the narrower one here")
    ap.add_argument("--judged-counts", action="store_true", help="also each configuration counted from the same "
                    "answers with the train qrels as clicks (the ceiling's counts): eval_gain_judged")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rules-only", action="store_true", help="read --out (an earlier run with per-fold estimates), "
                    "add its selection_rules and write it back; nothing else is run")
    args = ap.parse_args()
    if args.rules_only:
        doc = json.loads(args.out.read_text())
        doc["selection_rules"] = selection_rules(doc["configurations"])
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps({k: v["eval_gain"] for k, v in doc["selection_rules"].items()}))
        return
    load_before, began = os.getloadavg(), time.monotonic()
    data = load_split(args.data, args.split)
    lists = offline.served_lists(args.index, data, args.cache)
    rows, learner = grid(args.index, lists, data, args.heldout, args.propensities, args.clip,
                         offline.support_kwargs(args), args.learner_grid,
                         load_split(args.data, "train") if args.judged_counts else None)
    by_click = max(rows, key=lambda r: r["click_estimate"])
    oracle = max(rows, key=lambda r: r["eval_gain"])
    judged = {"best_from_judged_counts": max(rows, key=lambda r: r["eval_gain_judged"]),
              "judged_counts_at_best_by_click": by_click["eval_gain_judged"]} if args.judged_counts else {}
    doc = {"command": " ".join(sys.argv), "machine": machine_info(), "load_before": load_before, "split": args.split,
           "units": "weights in score units (x score_unit)", "learner": learner,
           "spearman_click_vs_eval": round(spearman([r["click_estimate"] for r in rows],
                                                    [r["eval_gain"] for r in rows]), 3),
           "best_by_click_estimate": by_click, "best_on_eval_split": oracle, **judged,
           "selection_rules": selection_rules(rows), "configurations": rows,
           "wall_s": round(time.monotonic() - began, 1), "load_after": os.getloadavg()}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("learner", "spearman_click_vs_eval", "best_by_click_estimate",
                                          "best_on_eval_split", *judged)}))


if __name__ == "__main__":
    main()
