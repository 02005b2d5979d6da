"""The click memory's doubly-robust estimate (`sieve feedback learn --estimate dr`): the IPS-DCG of the judged clicked
answers (memory_learn.Scored.dcg), plus a direct-method credit for each candidate no logged answer of its query
showed, which IPS can only charge (its clicks are 0 because nobody saw it, not because it is not relevant).

Per judged query, a candidate some answer showed has its clicks per examination y = the query's click targets on it
summed over its clicked answers / its answers (policy-aware weights: clicks / examinations; noise-corrected like the
targets, memory_learn.without_noise), weighted by its examinations. A weighted least-squares fit over those (query,
document) pairs of y on the memory's terms and the served rank,
    1, f(query, d), f(nearest queries, d), f(d), log2(2 + served rank), and each f x log2(2 + served rank)
(`features`), gives r_hat for the candidates none showed that the memory has evidence for (some remembered query's
users saw them: a term is not 0), clipped at 0; one it knows nothing about earns nothing, as under IPS. A ranking then
earns, per query,
    answers x sum over those candidates of r_hat / log2(2 + rank)
in the IPS targets' units (a clicked answer's target is 1 / its document's policy-aware propensity, so a query's
clicked answers sum to answers x clicks / examinations per document). The candidates some answer showed keep their
IPS estimate: on the shown support this is the doubly-robust estimator of Oosterhuis ("Doubly robust estimation for
correcting position bias in click feedback for unbiased learning to rank", TOIS 2023) with the logged policy's
exposure as the examination, and a promotion of an unseen document is credited with what the documents like it
(by the memory's own evidence for them and their served rank) were clicked for where users saw them.

Only candidates with evidence are credited: a memory that pushes shown documents down (f < 0) lifts the unknown ones
below them, and crediting those by the fit's intercept and rank would reward the demotion itself; the fit learns from
shown documents, nearly all of which have evidence (a shown document has a per-document term), so "no evidence" (all
terms 0) is not where it was fitted (tests/feedback/test_learn_guard.py: adversarial clicks).

RESULTS.md, issue 33, thirty-first session: on two NFCorpus dev logs a scratch version's rank correlation with dev
nDCG@10 over the oracle's grid rose from 0.65 and 0.62 (IPS) to 0.93 and 0.83, and the learner's choice gained +0.0126
and +0.0106 on dev against IPS's +0.0088 and +0.0072. The rank interactions matter: without them
the fit credits the per-document (popularity) term everywhere, and its choice on one of the two logs was the worst.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def features(fq: np.ndarray, fn: np.ndarray, fd: np.ndarray, lrank: np.ndarray) -> np.ndarray:
    """(..., 8) the fit's features of each candidate."""
    return np.stack([np.ones_like(fn), fq, fn, fd, lrank, fq * lrank, fn * lrank, fd * lrank], -1)


def ranks(scores: np.ndarray) -> np.ndarray:
    """(U, K) each candidate's 0-based rank under a stable sort by descending score."""
    order = np.argsort(-scores, axis=1, kind="stable")
    out = np.empty_like(order)
    np.put_along_axis(out, order, np.broadcast_to(np.arange(scores.shape[1]), scores.shape), axis=1)
    return out


@dataclass
class Unseen:
    """One judged fold's queries, each read on its first clicked answer's list: what the fit learns from (the shown
    candidates: y, w) and where its estimate counts (`unseen`)."""
    first: np.ndarray  # (U,) the list row of each query's first clicked answer
    answers: np.ndarray  # (U,) the query's /search answers in the logs
    lists: np.ndarray  # (U,) its clicked answers among the judged ones (the guard spreads a query's credit over them)
    of_list: np.ndarray  # (Q,) each judged list's query (0..U-1)
    unseen: np.ndarray  # (U, K) a candidate none showed (not padding)
    y: np.ndarray  # (U, K) clicks per examination (seen)
    w: np.ndarray  # (U, K) examinations (> 0: seen)
    lrank: np.ndarray  # (U, K) log2(2 + served rank)

    @property
    def seen(self) -> np.ndarray:
        """(U, K) a candidate some answer of the query showed (it has examinations)."""
        return self.w > 0

    @classmethod
    def of(cls, scored, exposure: dict) -> "Unseen":
        """From a judged fold (memory_learn.Scored) and the logs' exposure (Logs.exposure: query key -> (answers,
        doc id -> examinations))."""
        keys, ids, targets = scored.lists.keys, scored.ids, scored.lists.targets
        first: dict[str, int] = {}
        sums: dict[str, dict[str, float]] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
            into = sums.setdefault(key, {})
            for j in np.flatnonzero(targets[i]):
                doc = ids[i][j]
                if doc is not None:
                    into[doc] = into.get(doc, 0.0) + float(targets[i, j])
        order = list(first)
        at = {key: u for u, key in enumerate(order)}
        rows = np.array([first[k] for k in order], np.int64)
        shape = (len(order), scored.base.shape[1])
        unseen = np.zeros(shape, bool)
        y, w = np.zeros(shape), np.zeros(shape)
        answers = np.ones(len(order))
        for u, key in enumerate(order):
            n, exams = exposure.get(key, (0, {}))
            answers[u] = max(n, 1)
            for j, doc in enumerate(ids[rows[u]]):
                if doc is None:
                    continue
                e = exams.get(doc, 0.0)
                if e > 0:
                    w[u, j] = e
                    y[u, j] = sums[key].get(doc, 0.0) / answers[u]
                else:
                    unseen[u, j] = True
        of_list = np.array([at[k] for k in keys], np.int64)
        base = scored.base[rows]
        return cls(rows, answers, np.bincount(of_list, minlength=len(order)).astype(np.float64), of_list,
                   unseen & np.isfinite(base), y, w, np.log2(2.0 + ranks(base)))


def fit(folds: list[Unseen], terms: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray | None:
    """The weighted least-squares coefficients of y on `features` over every fold's shown candidates (`terms`: each
    fold's (fq, fn, fd) over its judged lists, as Scored.terms gives them); None without enough of them."""
    xs, ys, ws = [], [], []
    for unseen, (fq, fn, fd) in zip(folds, terms):
        x = features(fq[unseen.first], fn[unseen.first], fd[unseen.first], unseen.lrank)
        seen = unseen.seen
        xs.append(x[seen]), ys.append(unseen.y[seen]), ws.append(unseen.w[seen])
    x, y, w = np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)
    if len(y) < 4 * x.shape[1]:
        return None
    root = np.sqrt(w)
    return np.linalg.lstsq(x * root[:, None], y * root, rcond=None)[0]


@dataclass
class Credit:
    """One judged fold's direct-method part for one set of memory terms: each unseen candidate's worth (answers x
    r_hat), and the terms and the ranking without a memory, on each query's first list."""
    unseen: Unseen
    worth: np.ndarray  # (U, K)
    base: np.ndarray  # (U, K) the scores without a memory
    terms: tuple[np.ndarray, np.ndarray, np.ndarray]  # (U, K) each: f(query, d), f(nearest, d), f(d)
    without: float = 0.0  # the fold's credit without a memory

    @classmethod
    def of(cls, unseen: Unseen, beta: np.ndarray | None, terms, base: np.ndarray) -> "Credit":
        """`terms` ((fq, fn, fd) over the judged lists) and `base` ((Q, K)) are read on the first lists."""
        r = unseen.first
        fq, fn, fd = (t[r] for t in terms)
        if beta is None:
            worth = np.zeros(unseen.unseen.shape)
        else:
            r_hat = np.clip(features(fq, fn, fd, unseen.lrank) @ beta, 0.0, None)
            known = (fq != 0) | (fn != 0) | (fd != 0)  # some remembered query's users saw it
            worth = np.where(unseen.unseen & known, r_hat, 0.0) * unseen.answers[:, None]
        out = cls(unseen, worth, base[r], (fq, fn, fd))
        out.without = float(out.per_query(out.base).sum())
        return out

    def per_query(self, scores: np.ndarray) -> np.ndarray:
        """(U,) each query's credit under `scores` ((U, K), on its first list)."""
        if not self.worth.any():
            return np.zeros(len(self.worth))
        return (self.worth / np.log2(2.0 + ranks(scores))).sum(axis=1)

    def scores(self, w_query: float, w_near: float, w_doc: float) -> np.ndarray:
        fq, fn, fd = self.terms
        return self.base + w_query * fq + w_near * fn + w_doc * fd

    def total(self, w_query: float, w_near: float, w_doc: float) -> float:
        """The fold's summed credit with these weights (score units) less the ranking without a memory's: IPS + this
        is the doubly-robust difference the selection compares."""
        if not self.worth.any():
            return 0.0
        return float(self.per_query(self.scores(w_query, w_near, w_doc)).sum()) - self.without

    def per_list(self, weights: tuple[float, float, float], served: np.ndarray) -> np.ndarray:
        """(Q,) the credit of the memory with `weights` (w_query, w_near, w_doc) over the ranking `served` ((Q, K)),
        each query's spread evenly over its judged lists (the guard's per-answer differences, which it resamples)."""
        diff = self.per_query(self.scores(*weights)) - self.per_query(served[self.unseen.first])
        return (diff / self.unseen.lists)[self.unseen.of_list]
