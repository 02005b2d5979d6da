"""Training losses for CMC as plain functions of score tensors (CMC paper, section 3.2).

Every score tensor is (B, K): one row per query, one column per candidate. `mask` (B, K) is True for real
candidates; padded columns take no part in any softmax and contribute nothing to any sum.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class CMCLoss(NamedTuple):
    total: torch.Tensor  # lambda_ce * ce + lambda_kl * kl, what gets back-propagated
    ce: torch.Tensor
    kl: torch.Tensor


def check_scores(scores: torch.Tensor, other: torch.Tensor, mask: torch.Tensor | None) -> None:
    assert scores.dim() == 2, f"scores must be (B, K), got {tuple(scores.shape)}"
    assert other.shape == scores.shape, f"score shapes differ: {tuple(scores.shape)} vs {tuple(other.shape)}"
    if mask is not None:
        assert mask.shape == scores.shape and mask.dtype == torch.bool, f"mask must be bool {tuple(scores.shape)}"
        assert bool(mask.any(dim=1).all()), "every row needs at least one real candidate"


def masked_log_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """log softmax over the real candidates; padded entries are 0 (not -inf) so no NaN reaches a gradient."""
    if mask is None:
        return F.log_softmax(scores.float(), dim=-1)
    log_p = F.log_softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1)  # (B, K)
    return torch.where(mask, log_p, torch.zeros_like(log_p))


def kl_rows(log_p: torch.Tensor, log_q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """KL(p || q) = sum_j p_j (log p_j - log q_j) for each row: (B,)."""
    p = log_p.exp() if mask is None else torch.where(mask, log_p.exp(), torch.zeros_like(log_p))
    return (p * (log_p - log_q)).sum(dim=-1)


def cmc_loss(scores: torch.Tensor, retriever_scores: torch.Tensor, mask: torch.Tensor | None,
             lambda_ce: float, lambda_kl: float, gold_index: int = 0) -> CMCLoss:
    """lambda_ce * CE(gold) + lambda_kl * KL(p || r), p = softmax(CMC scores), r = softmax(retriever scores).

    The KL term keeps CMC's distribution near the retriever's (the paper's regulariser): with few labelled
    queries the CE term alone lets the layers drift from a ranking that is already good. r is a fixed target
    (detached): the retriever is not trained here.
    """
    check_scores(scores, retriever_scores, mask)
    if mask is not None:
        assert bool(mask[:, gold_index].all()), "the gold candidate must never be padding"
    log_p = masked_log_softmax(scores, mask)  # (B, K)
    log_r = masked_log_softmax(retriever_scores.detach(), mask)  # (B, K)
    ce = -log_p[:, gold_index].mean()
    kl = kl_rows(log_p, log_r, mask).mean()
    return CMCLoss(lambda_ce * ce + lambda_kl * kl, ce, kl)


def listwise_kl(student_scores: torch.Tensor, teacher_scores: torch.Tensor, mask: torch.Tensor | None,
                temperature: float = 1.0) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)), mean over rows: the student learns the teacher's whole
    distribution over the candidates, not only its top pick. No T^2 factor: the learning rate is tuned at T = 1.
    """
    check_scores(student_scores, teacher_scores, mask)
    assert temperature > 0, f"temperature must be positive, got {temperature}"
    log_s = masked_log_softmax(student_scores / temperature, mask)
    log_t = masked_log_softmax(teacher_scores.detach() / temperature, mask)
    return kl_rows(log_t, log_s, mask).mean()


def cmc_listwise_loss(scores: torch.Tensor, retriever_scores: torch.Tensor, relevance: torch.Tensor,
                      mask: torch.Tensor | None, lambda_ce: float, lambda_kl: float) -> CMCLoss:
    """lambda_ce * CE(t, p) + lambda_kl * KL(p || r) for lists holding any number of relevant candidates.

    t = relevance / its row sum (graded labels, 0 for non-relevant): every relevant candidate is pulled up in
    proportion to its grade, none is pushed down as a negative (the single-gold loss with the other relevant
    documents excluded teaches "exactly one candidate is relevant", which NFCorpus' ~40 per query contradicts).
    """
    check_scores(scores, retriever_scores, mask)
    check_scores(scores, relevance, mask)
    assert bool((relevance.sum(dim=1) > 0).all()), "every list needs a relevant candidate"
    log_p = masked_log_softmax(scores, mask)  # (B, K)
    log_r = masked_log_softmax(retriever_scores.detach(), mask)  # (B, K)
    target = relevance / relevance.sum(dim=1, keepdim=True)  # (B, K)
    ce = -(target * log_p).sum(dim=1).mean()
    kl = kl_rows(log_p, log_r, mask).mean()
    return CMCLoss(lambda_ce * ce + lambda_kl * kl, ce, kl)
