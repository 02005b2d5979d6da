"""What a click memory learned from a feedback_sim.py run's logs would give, offline (issue 33, RESULTS.md "Fifth
session: NFCorpus"): the memory `sieve feedback learn --learn memory` chooses on those logs (same split, grid and
guard report), applied to the served ranking of an evaluation split's queries, *whether or not the guard passed*
(a what-if: the command publishes only what the guard passes; this script publishes nothing).

The served ranking (hybrid+cmc, retrieve_k 512, no memory) of each evaluation query is computed once in this process
on the run's index (cached in --cache), the memory's boost is added as the server adds it (pipeline/searcher.py
`remembered`) and nDCG@10 is compared per query with the ranking without it (paired bootstrap). Evaluate on the dev
split while designing the learner; the test split only for reporting.

    .venv/bin/python benchmarks/feedback_memory_offline.py --index /tmp/nf20k/nfcorpus-train-test/index \
        --data ../shared/data/nfcorpus --split dev --cache /tmp/nf-dev-cands.pkl --out /tmp/offline.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sieve.stages  # noqa: E402,F401 (registers the core stages: hybrid, cmc)

from benchmarks.feedback_sim import by_group, paired, seen_groups  # noqa: E402
from sieve.evaluation.dataset import load_split  # noqa: E402
from sieve.evaluation.metrics import ndcg_at_k  # noqa: E402
from sieve.evaluation.runner import EvalConfig, pipeline  # noqa: E402
from sieve.training.feedback_cli import cosine_or_off, select_cosine_or_off  # noqa: E402


def served_lists(index: Path, data, cache: Path | None) -> dict:
    """query id -> (ids of all candidates in served order, their answer scores, the query vector the memory reads)."""
    if cache is not None and cache.is_file():
        return pickle.loads(cache.read_bytes())
    from sieve.pipeline.searcher import answer_scores
    from sieve.service.components import load_components
    from sieve.service.config import Settings

    settings = Settings(index_dir=index, cross_encoder_enabled=False, click_memory_enabled=False)
    components = load_components(settings)
    searcher, recipe, cfg = components.searcher, pipeline("hybrid+cmc"), EvalConfig()
    out = {}
    for qid, text in data.queries.items():
        params = recipe.params(text, cfg)
        params = dataclasses.replace(params, top_k=cfg.retrieve_k)
        outcome = searcher.search(params)
        cands = outcome.candidates
        ids = list(cands.ids if cands.ids is not None else outcome.index.ids(cands.rows))
        vectors = outcome.state.query_vectors
        vector = vectors.get("cmc", vectors.get("be"))
        out[qid] = (ids, answer_scores(cands.scores), vector.detach().float().cpu().numpy().reshape(-1))
    if cache is not None:
        cache.write_bytes(pickle.dumps(out))
    return out


def ndcgs(lists: dict, data, memory=None) -> dict:
    out = {}
    for qid, (ids, scores, vector) in lists.items():
        order = np.arange(len(ids))
        if memory is not None:
            boost = memory.boost(memory.key_of(data.queries[qid]), ids, vector)
            if boost.any():
                order = np.argsort(-(scores + boost), kind="stable")
        out[qid] = ndcg_at_k([ids[i] for i in order[:10]], data.qrels[qid], 10)
    return out


def learned(index: Path, cfg_kwargs: dict, clip: float | None = None):
    """(memory chosen whatever the guard said, report) of `sieve feedback learn --learn memory` on the index's logs."""
    from sieve.feedback import propensity
    from sieve.feedback.dataset import CLIP, Logs
    from sieve.service.config import Settings
    from sieve.training import memory_learn
    from sieve.training.feedback_cli import opened
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.feedback_learn import Vectors, scores_of

    settings = Settings(index_dir=index)
    biencoder, idx, store, served = opened(settings)
    model = served.model.float().cpu().eval()
    logs = Logs.read(settings.feedback_path())
    props = propensity.estimate(logs.for_propensity(), settings.feedback_swap_depth, fallback_eta=1.0)
    cfg = LearnConfig(**cfg_kwargs)
    judged = memory_learn.memory_verdict
    memory_learn.memory_verdict = lambda guard, cfg: None  # what-if: the chosen memory, whatever the guard says
    try:
        memory, report = memory_learn.learn_memory(
            cfg, logs, props, idx, lambda lists: scores_of(model, lists, Vectors(idx, lists)), None,
            CLIP if clip is None else clip)
    finally:
        memory_learn.memory_verdict = judged
    report["verdict"] = judged(report["guard"], cfg) if report.get("guard") else report.get("not_installed")
    idx.close()
    return memory, report


def fixed_choice(select, weights: str):
    """memory_learn.select with its choice replaced by `weights` (--weights; the grid it ran is still reported)."""
    w_query, w_doc, w_near, pseudo, near_min, near_k = (float(x) for x in weights.split(","))

    def chosen(folds, props, unit, vectors, doc_gate=None, doc_related="off"):
        _, grid = select(folds, props, unit, vectors, doc_gate, "off")
        return {"w_query": w_query * unit, "w_doc": w_doc * unit, "w_near": w_near * unit, "pseudo": pseudo,
                "near_min": near_min, "near_k": int(near_k), "doc_gate": None, "doc_related": None}, grid
    return chosen


def run_arguments(description: str) -> argparse.ArgumentParser:
    """The arguments of a what-if on a feedback_sim.py run's logs (this script's and feedback_memory_oracle.py's)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="a feedback_sim.py work index, its logs in feedback/")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--cache", type=Path, help="the evaluation queries' served lists (computed once)")
    ap.add_argument("--heldout", type=float, default=0.2)
    ap.add_argument("--propensities", choices=("position", "policy"), default="policy",
                    help="a click's weight: 1 / p(its rank), or 1 / its exposure over its query's answers")
    ap.add_argument("--guard-propensities", choices=("position", "policy"), default="position",
                    help="the guard's click weights")
    ap.add_argument("--clip", type=float, default=None, help="largest inverse-propensity weight (default: the learner's)")
    ap.add_argument("--support", choices=("shown", "all"), default=None,
                    help="the candidates the selection's estimate ranks (default: the learner's)")
    ap.add_argument("--guard-support", choices=("both", "shown", "all"), default=None,
                    help="the candidates the guard's estimate ranks (default: the learner's)")
    ap.add_argument("--memory-guard", choices=("auto", "heldout", "crossfit"), default=None,
                    help="`sieve feedback learn --memory-guard` (default: the learner's)")
    ap.add_argument("--memory-publish", choices=("refit", "fold"), default=None,
                    help="`sieve feedback learn --memory-publish` (default: the learner's)")
    ap.add_argument("--noise", choices=("estimated", "off"), default=None,
                    help="`sieve feedback learn --noise` (default: the learner's)")
    ap.add_argument("--estimate", choices=("ips", "dr"), default=None,
                    help="`sieve feedback learn --estimate` (default: the learner's)")
    ap.add_argument("--doc-related", type=select_cosine_or_off, default=None,
                    help="`sieve feedback learn --doc-related` (default: the learner's)")
    return ap


def support_kwargs(args) -> dict:
    """--support, --guard-support, --noise, --doc-related, --memory-guard, --memory-publish and --doc-gate as
    LearnConfig fields (those given)."""
    out = {k: v for k, v in (("support", args.support), ("guard_support", args.guard_support),
                             ("noise", args.noise), ("doc_related", args.doc_related), ("estimate", args.estimate),
                             ("memory_guard", getattr(args, "memory_guard", None)),
                             ("memory_publish", getattr(args, "memory_publish", None))) if v}
    if hasattr(args, "doc_gate"):
        out["doc_gate"] = args.doc_gate
    return out


def main() -> None:
    from sieve.evaluation.report import machine_info

    ap = run_arguments(__doc__)
    ap.add_argument("--near-grid", help="the learner's near_min grid for this run (comma-separated; default: its own)")
    ap.add_argument("--near-k-grid", help="the learner's near_k grid for this run (comma-separated; default: its own)")
    ap.add_argument("--doc-related-grid", help="the learner's DOC_RELATED_GRID for this run (comma-separated cosines; "
                    "default: its own)")
    ap.add_argument("--doc-gate", type=cosine_or_off, default=argparse.SUPPRESS,
                    help="`sieve feedback learn --doc-gate` (a cosine or off; default: the command's)")
    ap.add_argument("--weights", help="a what-if memory instead of the selection's choice: w_query,w_doc,w_near (x the "
                    "served scores' spread, as the grid),pseudo,near_min,near_k, e.g. 0,2,0,2,0.9,1 (is it refused?)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    data = load_split(args.data, args.split)
    groups = seen_groups(load_split(args.data, "train"), data) if args.split != "train" and \
        (args.data / "qrels" / "train.tsv").is_file() else None
    load_before, began = os.getloadavg(), time.monotonic()
    lists = served_lists(args.index, data, args.cache)
    from sieve.training import memory_learn
    if args.near_grid:  # a what-if grid: learn_memory reads the module's grids when it runs
        memory_learn.NEAR_GRID = tuple(float(x) for x in args.near_grid.split(","))
    if args.doc_related_grid:
        memory_learn.DOC_RELATED_GRID = tuple(float(x) for x in args.doc_related_grid.split(","))
    if args.near_k_grid:
        memory_learn.NEAR_K_GRID = tuple(int(x) for x in args.near_k_grid.split(","))
    if args.weights:
        memory_learn.select = fixed_choice(memory_learn.select, args.weights)
    memory, report = learned(args.index, {"heldout": args.heldout, "propensities": args.propensities,
                                            "guard_propensities": args.guard_propensities, **support_kwargs(args)},
                         args.clip)
    base = {"per_query": ndcgs(lists, data)}
    doc = {"command": " ".join(sys.argv), "machine": machine_info(), "load_before": load_before,
           "split": args.split, "queries": len(lists),
           "grid": {"near_min": memory_learn.NEAR_GRID, "near_k": memory_learn.NEAR_K_GRID,
                    "doc_related": memory_learn.DOC_RELATED_GRID},
           "default": round(float(np.mean(list(base["per_query"].values()))), 4),
           "memory": {k: report.get(k) for k in ("answers", "clicked_answers", "noise", "chosen", "judged_fold_chosen",
                                                      "published", "guard", "verdict", "grid")}}
    if memory is not None:
        forced = {"per_query": ndcgs(lists, data, memory)}
        doc.update({"forced_ndcg@10": round(float(np.mean(list(forced["per_query"].values()))), 4),
                    "forced_vs_default": paired(forced, base), "groups": by_group(forced, base, groups)})
    doc.update({"wall_s": round(time.monotonic() - began, 1), "load_after": os.getloadavg()})
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc.get(k) for k in ("default", "forced_ndcg@10", "forced_vs_default", "groups")}),
          json.dumps({k: doc["memory"].get(k) for k in ("chosen", "guard", "verdict")}))


if __name__ == "__main__":
    main()
