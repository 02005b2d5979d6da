"""annCUR benchmark arithmetic, plain functions of score matrices (no model, no I/O).

Both methods get the same budget B of cross-encoder calls per query and are judged against the cross-encoder's
own exact ranking of the (sub)corpus:
- be+ce: the bi-encoder's top B documents, scored exactly;
- anncur: k_i anchor items scored exactly (the query's embedding), then the top k_r = B - k_i other documents by
  the CUR approximation, scored exactly.
Top-k-Recall@B (the paper's Figure 3) is the share of the exact top-k that is among the B scored documents; after
an exact rerank of those B they are also the top of the returned list. nDCG@10 is the qrels' judgement of that
reranked list.
"""
from __future__ import annotations

import numpy as np

from sieve.evaluation.metrics import ndcg_at_k
from sieve.research.anncur.cur import approximate_scores, item_embeddings, select_anchor_items

RECALL_KS = (1, 10, 100)
RANKS = (1, 2, 4, 8, 16, 32, 64)


def topk_recall(exact: np.ndarray, scored: np.ndarray, k: int) -> float:
    """(N,) exact scores of one query, rows that were scored exactly -> |exact top-k & scored| / k."""
    assert exact.ndim == 1 and 1 <= k <= len(exact), (exact.shape, k)
    top = np.argsort(-exact, kind="stable")[:k]
    return float(np.isin(top, scored).sum() / k)


def be_candidates(be_scores: np.ndarray, budget: int) -> np.ndarray:
    """The bi-encoder's top `budget` rows."""
    return np.argsort(-be_scores, kind="stable")[:budget]


def anncur_candidates(approx: np.ndarray, anchors: np.ndarray, budget: int) -> np.ndarray:
    """The anchors plus the best budget - len(anchors) other rows by approximate score."""
    k_r = budget - len(anchors)
    assert k_r >= 0, (budget, len(anchors))
    order = np.argsort(-approx, kind="stable")
    others = order[~np.isin(order, anchors)][:k_r]
    return np.concatenate([anchors, others])


def reranked_ids(scored: np.ndarray, exact: np.ndarray, doc_ids: list[str], depth: int = 10) -> list[str]:
    order = scored[np.argsort(-exact[scored], kind="stable")][:depth]
    return [doc_ids[r] for r in order]


def judge(exact: np.ndarray, scored: np.ndarray, doc_ids: list[str], qrels: dict[str, int]) -> dict[str, float]:
    """Top-k-Recall for every k the corpus allows, and nDCG@10 of the exact rerank of the scored rows."""
    out = {f"topk_recall@{k}": topk_recall(exact, scored, k) for k in RECALL_KS if k <= len(exact)}
    out["ndcg@10"] = ndcg_at_k(reranked_ids(scored, exact, doc_ids), qrels, 10)
    return out


def mean_rows(per_query: list[dict[str, float]]) -> dict[str, float]:
    return {key: float(np.mean([q[key] for q in per_query])) for key in per_query[0]}


def be_rows(m_test: np.ndarray, be: np.ndarray, budgets, doc_ids, qrels: list[dict]) -> list[dict]:
    rows = []
    for b in budgets:
        per_query = [judge(m_test[q], be_candidates(be[q], b), doc_ids, qrels[q]) for q in range(len(m_test))]
        rows.append({"method": "be+ce", "k_i": None, "k_r": b, "ce_calls": b, **mean_rows(per_query)})
    return rows


def anncur_rows(m_test: np.ndarray, r_anc: np.ndarray, k_is, budgets, seeds, doc_ids, qrels: list[dict],
                anchor_method: str = "random") -> list[dict]:
    """One row per (k_i, budget > k_i... or = k_i), metrics averaged over queries and anchor seeds."""
    n = m_test.shape[1]
    rows = []
    for k_i in k_is:
        runs = {b: [] for b in budgets if b >= k_i}
        for seed in seeds:
            anchors = select_anchor_items(n, k_i, method=anchor_method, seed=seed, r_anc=r_anc)
            approx = approximate_scores(m_test[:, anchors], item_embeddings(r_anc, anchors))  # (Q, N)
            for b in runs:
                runs[b] += [judge(m_test[q], anncur_candidates(approx[q], anchors, b), doc_ids, qrels[q])
                            for q in range(len(m_test))]
        rows += [{"method": "anncur", "k_i": k_i, "k_r": b - k_i, "ce_calls": b, "anchor_method": anchor_method,
                  "seeds": len(seeds), **mean_rows(per_query)} for b, per_query in runs.items()]
    return rows


def exhaustive_row(m_test: np.ndarray, doc_ids, qrels: list[dict]) -> dict:
    """The cross-encoder over the whole (sub)corpus: the ceiling both methods approach."""
    everything = np.arange(m_test.shape[1])
    per_query = [judge(m_test[q], everything, doc_ids, qrels[q]) for q in range(len(m_test))]
    return {"method": "ce-exhaustive", "k_i": None, "k_r": None, "ce_calls": int(m_test.shape[1]), **mean_rows(per_query)}


def spectrum(matrix: np.ndarray, top: int = 64, center_rows: bool = False) -> dict:
    """Singular-value decay: the first `top` values over the largest, and the relative Frobenius error of the best
    rank-r approximation, sqrt(sum_{i>r} s_i^2 / sum_i s_i^2), for r in RANKS.

    center_rows: each query's mean score subtracted first. A per-query offset changes no ranking but is a rank-one
    component of its own, which can dominate the raw spectrum (a [CLS] logit that hardly depends on the document);
    the centred spectrum is the part of the matrix that orders documents."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if center_rows:
        matrix = matrix - matrix.mean(axis=1, keepdims=True)
    s = np.linalg.svd(matrix, compute_uv=False)
    energy = np.cumsum(s[::-1] ** 2)[::-1]  # energy[r] = sum_{i>=r} s_i^2
    total, largest = energy[0] or 1.0, s[0] or 1.0  # an all-zero matrix (a part never trained) reads as zeros
    errors = {str(r): float(np.sqrt(energy[r] / total)) for r in RANKS if r < len(s)}
    return {"shape": list(matrix.shape), "normalized": (s[:top] / largest).tolist(), "rank_r_error": errors}
