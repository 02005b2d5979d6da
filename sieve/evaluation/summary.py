"""Per-pipeline numbers from per-query results: ranking quality, latency per stage, cross-encoder cost."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from sieve.evaluation.metrics import mean_metric, mrr_at_k, ndcg_at_k, recall_at_k

RECALL_KS = (1, 4, 8, 16, 32, 64, 100)


def latency_stats(values_ms: Sequence[float]) -> dict[str, float]:
    """Percentiles interpolate linearly between order statistics (numpy's default)."""
    values = np.asarray(values_ms, dtype=np.float64)
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p95": float(np.percentile(values, 95))}


def stage_latency(timings: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Stats per timings key, over the queries where that stage ran, keys in the order the pipeline ran them."""
    stages = list(dict.fromkeys(key for t in timings for key in t))
    return {stage: latency_stats([t[stage] for t in timings if stage in t]) for stage in stages}


def quality(rankings: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    scores = {"ndcg@10": mean_metric(ndcg_at_k, rankings, qrels, 10),
              "mrr@10": mean_metric(mrr_at_k, rankings, qrels, 10)}
    scores.update({f"recall@{k}": mean_metric(recall_at_k, rankings, qrels, k) for k in RECALL_KS})
    return scores


def summarize(rankings: Mapping[str, Sequence[str]], timings: Sequence[Mapping[str, float]],
              ce_pairs: Sequence[int], qrels: Mapping[str, Mapping[str, int]]) -> dict:
    """One pipeline's entry in eval_<name>.json."""
    stages = stage_latency(timings)
    total = stages["total"]
    return {**quality(rankings, qrels),
            "latency_ms_p50": total["p50"], "latency_ms_p95": total["p95"], "latency_ms_mean": total["mean"],
            "stage_latency_ms": stages,
            "ce_pairs": float(np.mean(ce_pairs)),
            "depth": float(np.mean([len(r) for r in rankings.values()])),
            "queries": len(rankings)}
