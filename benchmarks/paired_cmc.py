"""Two CMC checkpoints on the same test queries, query by query (issue 25): how many top-10s differ, how many
queries each wins, and a paired bootstrap 95% interval of the nDCG@10 difference (B - A).

A mean difference of +0.003 over 300 queries can be noise; this says whether it is.

    python benchmarks/paired_cmc.py --data ../shared/data/arguana --a shipped:cmc-fusion --b adapted \\
        --out benchmarks/results/adapt/paired_arguana.json

`adapted` = the eval index's adapted CMC (what `sieve eval` serves when SIEVE_CMC_PATH is unset); any other value
is a SIEVE_CMC_PATH (a directory, shipped:NAME or untrained). Same seeded query sample as `sieve eval
--max-queries`; SciFact is also split into seen / unseen documents as in the transfer report.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import closing
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sieve.evaluation.backends import InProcessBackend  # noqa: E402
from sieve.evaluation.dataset import load_split  # noqa: E402
from sieve.evaluation.local import load_local  # noqa: E402
from sieve.evaluation.metrics import ndcg_at_k  # noqa: E402
from sieve.evaluation.report import machine_info  # noqa: E402
from sieve.evaluation.runner import EvalConfig, collect, pipeline  # noqa: E402
from sieve.evaluation.transfer import TRAIN_SPLITS, seen_subsets  # noqa: E402
from sieve.service.config import Settings  # noqa: E402


def paired(a: np.ndarray, b: np.ndarray, rounds: int = 10000, seed: int = 0) -> dict:
    """Mean of b - a with a paired bootstrap 95% interval; wins, losses and ties of b."""
    diff = b - a
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(rounds, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"queries": len(diff), "a": round(float(a.mean()), 4), "b": round(float(b.mean()), 4),
            "b_minus_a": round(float(diff.mean()), 4), "ci95": [round(float(low), 4), round(float(high), 4)],
            "b_wins": int((diff > 1e-9).sum()), "b_loses": int((diff < -1e-9).sum())}


def rankings(data, cmc: str) -> tuple[dict, str]:
    settings = Settings() if cmc == "adapted" else Settings(cmc_path=cmc)
    with closing(load_local(settings, data.name, data.corpus_path)) as components:
        run = collect(InProcessBackend(components.searcher, components.precision), pipeline("hybrid+cmc"), data,
                      EvalConfig())
        return run.rankings, getattr(components.searcher.cmc, "name", "?")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a BEIR folder (its test split)")
    p.add_argument("--a", default="shipped:cmc-fusion")
    p.add_argument("--b", default="adapted")
    p.add_argument("--max-queries", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    data = load_split(args.data, "test", max_queries=args.max_queries, seed=args.seed)
    (ra, name_a), (rb, name_b) = rankings(data, args.a), rankings(data, args.b)
    ids = list(data.qrels)
    nd = {q: (ndcg_at_k(ra[q], data.qrels[q], 10), ndcg_at_k(rb[q], data.qrels[q], 10)) for q in ids}
    groups = {"all": set(ids)}
    if data.name == "scifact":
        groups.update(seen_subsets(data, TRAIN_SPLITS[data.name]))
    table = {g: paired(np.array([nd[q][0] for q in ids if q in members]), np.array([nd[q][1] for q in ids if q in members]))
             for g, members in groups.items()}
    table["all"]["top10_differs"] = sum(ra[q][:10] != rb[q][:10] for q in ids)
    doc = {"dataset": data.name, "split": "test", "a": f"{args.a} ({name_a})", "b": f"{args.b} ({name_b})",
           "pipeline": "hybrid+cmc", "groups": table, "machine": machine_info(),
           "command": " ".join(["python", *sys.argv])}
    print(f"{data.name}: A = {doc['a']}, B = {doc['b']}\n| queries | n | A | B | B - A | 95% CI | B wins / loses |\n"
          "|---|---|---|---|---|---|---|")
    for g, r in table.items():
        print(f"| {g} | {r['queries']} | {r['a']:.4f} | {r['b']:.4f} | {r['b_minus_a']:+.4f} | "
              f"[{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}] | {r['b_wins']} / {r['b_loses']} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
