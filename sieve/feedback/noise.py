"""Click noise: how often an examined result the user finds NOT relevant is clicked anyway, and the affine correction
of the click estimate that removes it (`sieve feedback learn --noise estimated`).

The position-based model with noisy clicks (the "trust bias" family: Agarwal et al., WWW 2019; Vardasbi et al.,
"When Inverse Propensity Scoring does not Work: Affine Corrections for Unbiased Learning to Rank", CIKM 2020):
    P(click on d at rank r) = p(r) x (b + (a - b) x R(d)),  R(d) in {0, 1}
so a document's clicks over its expected examinations (COEC, memory.py) tend to a where relevant and to b, the noise
rate, where not. An inverse-propensity estimate of a ranking's DCG then credits every shown document with b of a
relevant one's value whatever its relevance: it favours keeping shown non-relevant documents over promoting ones no
answer of the query showed, by b / a (0.05 / 0.9 = 6% with careful users, 0.2 / 0.9 = 22% with careless ones).
The affine correction subtracts that expected noise credit from each shown document, so the estimate is unbiased for
(a - b) x relevance.

`estimate`: a and b from the counts per (query, document) by EM for a two-rate Poisson mixture: clicks ~ Poisson(
examinations x a) with probability pi, else Poisson(examinations x b). `expected_noise`: what b is worth in the click
estimate's units, per (query, document). Pure arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_PAIRS = 50  # (query, document) pairs with examinations the fit needs; fewer: no estimate


@dataclass
class Noise:
    relevant: float  # a: clicks per examination of a relevant document
    noise: float  # b: clicks per examination of a non-relevant one
    share: float  # pi: the pairs' share of relevant ones
    pairs: int  # the pairs the fit used

    def as_dict(self) -> dict:
        return {"relevant_click_rate": round(self.relevant, 4), "noise_click_rate": round(self.noise, 4),
                "relevant_share": round(self.share, 4), "pairs": self.pairs}


def estimate(clicks, exams, iterations: int = 200) -> Noise | None:
    """The two click rates from per-pair clicks and expected examinations (arrays of the same length); None with fewer
    than MIN_PAIRS examined pairs or no click. Started from the pooled rate split 3:1/3 and a 10% relevant share."""
    c, e = np.asarray(clicks, np.float64), np.asarray(exams, np.float64)
    keep = e > 0
    c, e = c[keep], e[keep]
    if len(c) < MIN_PAIRS or not c.sum():
        return None
    pooled = c.sum() / e.sum()
    a, b, pi = min(3 * pooled, 1.0), pooled / 3, 0.1
    for _ in range(iterations):
        # log-likelihood of each pair under each rate, up to the terms both share (c log e - log c!)
        la = np.log(pi) + c * np.log(a) - e * a
        lb = np.log(1 - pi) + c * np.log(b) - e * b
        r = 1.0 / (1.0 + np.exp(np.clip(lb - la, -500, 500)))  # P(relevant | the pair's counts)
        a_new = float((r * c).sum() / max((r * e).sum(), 1e-12))
        b_new = float(((1 - r) * c).sum() / max(((1 - r) * e).sum(), 1e-12))
        pi = float(np.clip(r.mean(), 1e-4, 1 - 1e-4))
        a_new, b_new = max(a_new, 1e-6), max(b_new, 1e-6)
        if a_new < b_new:  # the labels swapped: keep "relevant" the higher rate
            a_new, b_new, pi = b_new, a_new, 1 - pi
        done = abs(a_new - a) < 1e-7 and abs(b_new - b) < 1e-7
        a, b = a_new, b_new
        if done:
            break
    return Noise(a, b, pi, int(len(c)))


def expected_noise(answers, keys, props, weight) -> dict[tuple[str, str], float]:
    """(query key, doc id) -> the click-estimate credit that clicks at rate 1 per examination would give the document
    over `answers` (memory.Shown) of the queries in `keys` (None: every query): the sum over the answers that showed
    it of p(rank) x the weight a click there gets (`weight(key, doc, rank)`). Times b, it is what noise alone earns
    it."""
    out: dict[tuple[str, str], float] = {}
    for answer in answers:
        if keys is not None and answer.key not in keys:
            continue
        for rank, doc in enumerate(answer.shown, 1):
            cell = (answer.key, doc)
            out[cell] = out.get(cell, 0.0) + props.of(rank) * weight(answer.key, doc, rank)
    return out
