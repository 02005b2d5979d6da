"""The CUR algebra of annCUR (Yadav et al. 2022) as plain functions of arrays.

M is a cross-encoder's score matrix, queries x items. Offline, k_q anchor queries are scored against every item:
R_anc = M[anchor queries, :] (k_q, N). With k_i anchor items, C_anc = R_anc[:, anchor items] (k_q, k_i) and
U = pinv(C_anc) (k_i, k_q); the item embeddings are the columns of E = U @ R_anc (k_i, N), stored here as rows
(N, k_i). At test time a query is scored against the anchor items only, e_q = M[q, anchor items] (k_i,) (k_i
cross-encoder calls), and e_q @ E approximates its scores for every item: the CUR decomposition
M ~= C U R with C = M[:, anchor items] and R = R_anc. When C_anc has the rank of M (M of rank r <= min(k_q, k_i)
and anchors in general position) the approximation is exact.
"""
from __future__ import annotations

import numpy as np

ANCHOR_METHODS = ("random", "top")


def _check_matrix(name: str, array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    return array


def select_anchor_items(n_items: int, k_i: int, *, method: str = "random", seed: int = 0,
                        r_anc: np.ndarray | None = None) -> np.ndarray:
    """(k_i,) sorted, distinct item indices.

    random: uniform without replacement, a function of `seed` alone (the paper's choice).
    top: each anchor query's best item, then each one's second best, ... (query order breaks ties) until k_i
    distinct items: the items the anchor queries score highest, spread over all of them. Needs r_anc (k_q, N)."""
    if method not in ANCHOR_METHODS:
        raise ValueError(f"unknown anchor method {method!r}; allowed: {', '.join(ANCHOR_METHODS)}")
    if not 1 <= k_i <= n_items:
        raise ValueError(f"k_i must be in 1..{n_items} (the number of items), got {k_i}")
    if method == "random":
        return np.sort(np.random.default_rng(seed).choice(n_items, size=k_i, replace=False)).astype(np.int64)
    r_anc = _check_matrix("r_anc", r_anc if r_anc is not None else np.empty((0, 0)))
    if r_anc.shape[1] != n_items:
        raise ValueError(f"r_anc has {r_anc.shape[1]} columns, expected one per item ({n_items})")
    ranked = np.argsort(-r_anc, axis=1, kind="stable")  # (k_q, N) best first
    order = ranked.T.reshape(-1)  # rank 1 of every query, then rank 2, ...
    _, first = np.unique(order, return_index=True)
    return np.sort(order[np.sort(first)[:k_i]]).astype(np.int64)


# Singular values of C_anc below this fraction of the largest are dropped by the pseudo-inverse. Scores come from
# float32 models (~7 significant digits), so directions weaker than ~1e-6 are rounding noise; inverting them would
# only amplify it. numpy's own default (1e-15) suits exact float64 data only.
DEFAULT_RCOND = 1e-6


def item_embeddings(r_anc: np.ndarray, anchor_items: np.ndarray, rcond: float = DEFAULT_RCOND) -> np.ndarray:
    """(k_q, N) anchor-query scores and (k_i,) anchor item indices -> (N, k_i) float32 item embeddings,
    the rows of (pinv(C_anc) @ R_anc).T, computed in float64."""
    r = _check_matrix("r_anc", r_anc).astype(np.float64)
    anchors = np.asarray(anchor_items, dtype=np.int64)
    if anchors.ndim != 1 or len(anchors) == 0 or len(np.unique(anchors)) != len(anchors):
        raise ValueError(f"anchor_items must be distinct indices in a non-empty 1-D array, got {anchors!r}")
    if anchors.min() < 0 or anchors.max() >= r.shape[1]:
        raise ValueError(f"anchor_items must lie in 0..{r.shape[1] - 1}")
    c_anc = r[:, anchors]  # (k_q, k_i)
    u = np.linalg.pinv(c_anc, rcond=rcond)  # (k_i, k_q)
    e = u @ r  # (k_i, N)
    assert e.shape == (len(anchors), r.shape[1]), e.shape
    return np.ascontiguousarray(e.T, dtype=np.float32)  # (N, k_i)


def approximate_scores(query_anchor_scores: np.ndarray, item_emb: np.ndarray) -> np.ndarray:
    """(B, k_i) exact scores of B queries against the anchor items, (N, k_i) item embeddings -> (B, N)."""
    c = _check_matrix("query_anchor_scores", query_anchor_scores)
    e = _check_matrix("item_emb", item_emb)
    if c.shape[1] != e.shape[1]:
        raise ValueError(f"queries carry {c.shape[1]} anchor scores but the items were embedded with {e.shape[1]} anchors")
    return c.astype(np.float32) @ e.astype(np.float32).T  # (B, N)
