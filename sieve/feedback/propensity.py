"""Position bias under the position-based click model: P(click at rank r) = p_r x P(relevant), p_1 = 1.

Estimated from randomised adjacent swaps (SIEVE_FEEDBACK_SWAP_FRACTION: results p and p+1 trade places in a few
answers, chosen at random, so the documents that land on each position are the same population either way). With
c(r) the click rate at rank r in unswapped answers and s(r) in answers where the pair (p, p+1) was swapped:
    c(p)   = p_p     R_p        s(p)   = p_p     R_{p+1}
    c(p+1) = p_{p+1} R_{p+1}    s(p+1) = p_{p+1} R_p
so (p_{p+1} / p_p)^2 = c(p+1) s(p+1) / (c(p) s(p)): the relevances cancel (intervention harvesting in the spirit
of Joachims et al., WSDM 2017; Agarwal et al., WSDM 2019). Ranks past the swapped ones follow the power law
(1/r)^eta fitted to the estimates. Without enough swaps the stated default (1/r)^eta is used.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_ETA = 1.0
MIN_SWAPPED_CLICKS = 20  # clicks on each side of each swapped pair before its estimate is trusted


@dataclass
class Propensities:
    values: np.ndarray  # (R,) p_1..p_R
    source: str  # "estimated from N swapped answers" | "default (1/rank)^eta"
    eta: float

    def of(self, rank: int) -> float:
        """p at a 1-based rank (the power law past the table)."""
        if rank <= len(self.values):
            return float(self.values[rank - 1])
        return float(rank ** -self.eta)


def default(max_rank: int = 100, eta: float = DEFAULT_ETA) -> Propensities:
    ranks = np.arange(1, max_rank + 1, dtype=np.float64)
    return Propensities(ranks ** -eta, f"default (1/rank)^{eta:g}", eta)


def estimate(impressions, depth: int, max_rank: int = 100, fallback_eta: float = DEFAULT_ETA) -> Propensities:
    """`impressions`: iterable of (shown length, swap position or None, clicked 1-based displayed ranks)."""
    views_c, clicks_c = np.zeros(depth + 2), np.zeros(depth + 2)  # unswapped: answers reaching rank r, clicks at r
    views_s, clicks_s = np.zeros((depth + 1, 2)), np.zeros((depth + 1, 2))  # swapped pair p: ranks p, p+1
    swapped = 0
    for n, swap, clicked in impressions:
        if swap is None:
            views_c[1:min(n, depth + 1) + 1] += 1
            for r in clicked:
                if r <= depth + 1:
                    clicks_c[r] += 1
        elif swap < depth + 1:
            swapped += 1
            views_s[swap] += 1
            for r in clicked:
                if r in (swap, swap + 1):
                    clicks_s[swap, r - swap] += 1
    ratios = []
    for p in range(1, depth):
        if min(clicks_s[p].min(), clicks_c[p], clicks_c[p + 1]) < MIN_SWAPPED_CLICKS:
            break
        c_p, c_q = clicks_c[p] / views_c[p], clicks_c[p + 1] / views_c[p + 1]
        s_p, s_q = clicks_s[p] / views_s[p]
        ratios.append(float(np.sqrt((c_q * s_q) / (c_p * s_p))))
    if not ratios:
        return default(max_rank, fallback_eta)
    known = np.cumprod([1.0, *ratios])  # p_1..p_{len+1}
    ranks = np.arange(1, len(known) + 1, dtype=np.float64)
    eta = float(-np.polyfit(np.log(ranks), np.log(known), 1)[0]) if len(known) > 1 else fallback_eta
    values = np.arange(1, max_rank + 1, dtype=np.float64) ** -eta
    values[:len(known)] = known
    return Propensities(np.minimum(values, 1.0), f"estimated from {swapped} swapped answers (ranks 1-{len(known)}; "
                                                 f"power law eta {eta:.2f} past them)", eta)
