"""IR metrics as plain functions of a ranking and graded judgements (BEIR / pytrec_eval conventions)."""
from __future__ import annotations

import math
from typing import Mapping, Sequence


def dcg(gains: Sequence[float]) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains))


def ndcg_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    """Linear gains (grade as gain), as pytrec_eval's ndcg_cut used by BEIR."""
    gains = [max(judged.get(doc, 0), 0) for doc in ranking[:k]]
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    return dcg(gains) / dcg(ideal) if ideal else 0.0


def mrr_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    for i, doc in enumerate(ranking[:k]):
        if judged.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def recall_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    relevant = {doc for doc, grade in judged.items() if grade > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranking[:k])) / len(relevant)


def mean_metric(fn, rankings: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]], k: int) -> float:
    """Mean over the judged queries that have at least one relevant document."""
    queries = [q for q in qrels if any(g > 0 for g in qrels[q].values())]
    return sum(fn(rankings.get(q, []), qrels[q], k) for q in queries) / len(queries)
