"""What a refused click-memory update would have given (issue 33, RESULTS.md "Click memory"): on a copy of a
feedback_sim.py head-scenario index (its logs kept, its published memories removed), `sieve feedback learn --learn
memory --split time` judges the memory of all the logs against no memory, publishes it when that guard passes, and
nDCG@10 on the head queries' qrels is measured with and without it (two servers, feedback off).

    cp -r /tmp/clicks-sim/scifact-head/index /tmp/whatif/index && rm -rf /tmp/whatif/index/clicks
    .venv/bin/python benchmarks/feedback_memory_whatif.py --index /tmp/whatif/index --data ../shared/data/scifact \
        --out benchmarks/results/feedback_memory_whatif_head.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.feedback_sim import Served, evaluate, learn, paired  # noqa: E402
from sieve.evaluation.dataset import load_split  # noqa: E402


def main() -> None:
    from sieve.evaluation.report import machine_info

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--head", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    train = load_split(args.data, "train")
    heads = sorted(np.random.default_rng(args.seed).choice(sorted(train.queries), args.head, replace=False))
    data = dataclasses.replace(train, queries={q: train.queries[q] for q in heads},
                               qrels={q: train.qrels[q] for q in heads})
    load_before = os.getloadavg()
    report = learn(args.index, 0, "time", "memory")
    results = {}
    for name, extra in (("default", {"SIEVE_CLICK_MEMORY_ENABLED": "false"}), ("memory", {})):
        judge = Served(args.index, args.index.parent / f"judge-{name}.log", 0.0,
                       {"SIEVE_FEEDBACK_ENABLED": "false", **extra})
        try:
            results[name] = evaluate(judge.url, data)
        finally:
            judge.stop()
    doc = {"command": " ".join(sys.argv), "machine": machine_info(), "load_before": load_before,
           "load_after": os.getloadavg(),
           "memory": {k: report["memory"].get(k) for k in ("chosen", "guard", "answers", "installed", "not_installed")},
           "default": results["default"]["ndcg@10"], "ndcg@10": results["memory"]["ndcg@10"],
           "vs_default": paired(results["memory"], results["default"]), "click_memory": results["memory"]["click_memory"]}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("default", "ndcg@10", "vs_default")}))


if __name__ == "__main__":
    main()
