"""How well the click memory's selection picks its weights (issue 33, RESULTS.md "Eighteenth session"): for every
configuration of a grid, the click estimate `sieve feedback learn` selects on (the mean IPS-DCG difference against
no memory over the validation folds' clicked answers, exactly as memory_learn.select computes it) beside what that
configuration, counted as the learner would publish it (fit + validation answers), gives on an evaluation split's
nDCG@10 offline (feedback_memory_offline.py's served lists). The best configuration on the evaluation split is an
oracle, not a learner: it says how much of the gap to a target is the counts and how much the choice.

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
         clip: float | None = None, support: dict | None = None) -> tuple[list[dict], dict]:
    """`support`: LearnConfig's support fields (feedback_memory_offline.support_kwargs), the learner's when empty."""
    from sieve.feedback.memory import ClickMemory, tally
    from sieve.training import memory_learn
    from sieve.training.feedback_learn import ips_dcg

    W = memory_learn.W_GRID[:8]  # x the score unit
    seen = {}
    learn, select = memory_learn.learn_memory, memory_learn.select

    def capture_learn(cfg, logs, *rest):  # the logs and settings the learner reads
        seen.update(cfg=cfg, logs=logs)
        return learn(cfg, logs, *rest)

    def capture_select(folds, props, unit, vectors, *rest):  # its folds, propensities, score unit and query vectors
        seen.update(folds=folds, props=props, unit=unit, vectors=vectors)
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
    bases = [s.judged(s.base) for s in judged]  # the learner's estimate: -inf off its support
    answers = seen["logs"].answers()
    held_from, val_from = memory_learn.time_cuts(answers, cfg)
    published = tally([a for a in answers if memory_learn.side(a.key, a.t, held_from, val_from, cfg) != "heldout"],
                      props)  # the fit and validation answers: what the learner counts the memory it publishes from
    base = float(np.mean(list(offline.ndcgs(lists, data).values())))
    rows = []
    for m in memory_learn.PSEUDO_GRID:
        counted = [ClickMemory.build(tally(c, props), 1.0, 1.0, m, w_near=1.0, vectors=vectors) for c, _ in folds]
        memory = ClickMemory.build(published, 0.0, 1.0, m, w_near=1.0, vectors=vectors)
        for near_min, near_k in NEAR:
            terms = [s.terms(replace(c, near_min=near_min, near_k=near_k)) for c, s in zip(counted, judged)]
            memory.near_min, memory.near_k = near_min, near_k
            for wd, wn in itertools.product(W, W):
                if not (wd or wn) or (not wn and (near_min, near_k) != NEAR[-1]):
                    continue
                diff = np.concatenate([ips_dcg(b + unit * (wn * fn + wd * fd), s.lists)
                                       for s, b, (_, fn, fd) in zip(judged, bases, terms)]) - none
                memory.w_doc, memory.w_near = wd * unit, wn * unit
                gain = float(np.mean(list(offline.ndcgs(lists, data, memory).values()))) - base
                rows.append({"pseudo": m, "near_min": near_min, "near_k": near_k, "w_doc": wd, "w_near": wn,
                             "click_estimate": round(float(diff.mean()), 5), "eval_gain": round(gain, 4)})
    return rows, {"chosen": report.get("chosen"), "verdict": report.get("verdict"), "score_unit": unit,
                  "validation_answers": int(len(none)), "default": round(base, 4)}


def spearman(x, y) -> float:
    """Rank correlation (ties share their mean rank)."""
    def ranks(v):
        v = np.asarray(v, np.float64)
        r = np.empty(len(v))
        r[np.argsort(v, kind="stable")] = np.arange(len(v))
        _, group = np.unique(v, return_inverse=True)
        return (np.bincount(group, r) / np.bincount(group))[group]
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def main() -> None:
    from sieve.evaluation.report import machine_info

    ap = offline.run_arguments(__doc__)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    load_before, began = os.getloadavg(), time.monotonic()
    data = load_split(args.data, args.split)
    lists = offline.served_lists(args.index, data, args.cache)
    rows, learner = grid(args.index, lists, data, args.heldout, args.propensities, args.clip,
                         offline.support_kwargs(args))
    by_click = max(rows, key=lambda r: r["click_estimate"])
    oracle = max(rows, key=lambda r: r["eval_gain"])
    doc = {"command": " ".join(sys.argv), "machine": machine_info(), "load_before": load_before, "split": args.split,
           "units": "weights in score units (x score_unit)", "learner": learner,
           "spearman_click_vs_eval": round(spearman([r["click_estimate"] for r in rows],
                                                    [r["eval_gain"] for r in rows]), 3),
           "best_by_click_estimate": by_click, "best_on_eval_split": oracle, "configurations": rows,
           "wall_s": round(time.monotonic() - began, 1), "load_after": os.getloadavg()}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("learner", "spearman_click_vs_eval", "best_by_click_estimate",
                                          "best_on_eval_split")}))


if __name__ == "__main__":
    main()
