"""`sieve feedback learn`: CMC trained from logged answers and the clicks on them, started from the served model.

Loss (unbiased learning to rank, Joachims et al., WSDM 2017): each clicked candidate's softmax cross-entropy over
its answer's logged candidate list, weighted by 1 / p(rank it was shown at) (sieve/feedback/propensity.py), plus
`teacher` x KL(served || model) over the whole list, which holds the model near the served one where clicks say
nothing. Selection (the step kept) is on a validation share of the training queries; the guard on queries held out
of both (split by the query's hash, so no query is on both sides; or, with split "time", on the latest answers).

The guard (`verdict`): on the held-out answers, the counterfactual (IPS) estimate of DCG over clicked documents,
sum over clicks of (1 / p(shown rank)) / log2(1 + new rank), of the new model minus that of the served model, with a
95% bootstrap interval over answers. Published only when the interval's lower bound is above 0, and never on fewer
than `min_heldout` held-out answers with clicks.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict

import numpy as np
import torch

from sieve.feedback.dataset import ClickLists
from sieve.training.feedback_config import LearnConfig
from sieve.models.cmc import CMC


class Vectors:
    """The candidate vectors of all lists, read from the index once (rows -> positions in one table)."""

    def __init__(self, index, *lists: ClickLists):
        rows = np.unique(np.concatenate([cl.rows[cl.rows >= 0] for cl in lists] or [np.zeros(0, np.int64)]))
        self.table = torch.from_numpy(np.asarray(index.embeddings(rows), np.float32)) if len(rows) else None
        self.rows = rows

    def of(self, rows: np.ndarray) -> torch.Tensor:
        at = np.searchsorted(self.rows, np.clip(rows, 0, None)).clip(max=max(len(self.rows) - 1, 0))
        return self.table[torch.from_numpy(at)]  # (B, K, d); padding reads some row, masked out


def split(lists: ClickLists, share: float, seed: int, by: str = "query") -> tuple[ClickLists, ClickLists]:
    """(kept, held out). by query: whole queries (by hash) go to one side (does the model help queries it never
    saw?); by time: the latest answers are held out (does it help what comes next, the same queries included, as a
    query log repeats)."""
    if by == "time":
        cut = len(lists) - int(round(share * len(lists)))
        return lists.select(np.arange(cut)), lists.select(np.arange(cut, len(lists)))
    keys = sorted(set(lists.keys))
    rng = np.random.default_rng(seed)
    held = set(rng.permutation(keys)[:int(round(share * len(keys)))].tolist())
    mask = np.array([k in held for k in lists.keys], bool)
    return lists.select(np.flatnonzero(~mask)), lists.select(np.flatnonzero(mask))


def tensors(lists: ClickLists, picks, vectors: Vectors, n_features: int) -> tuple:
    sub = lists.select(picks)
    mask = torch.from_numpy(sub.rows >= 0)  # (B, K)
    return (torch.from_numpy(sub.query_vectors), vectors.of(sub.rows), mask,
            torch.from_numpy(sub.features[:, :, :n_features]), torch.from_numpy(sub.targets))


def scores_of(model: CMC, lists: ClickLists, vectors: Vectors, chunk: int = 64) -> np.ndarray:
    """(Q, K) scores, -inf on padding."""
    model.eval()
    out = []
    with torch.inference_mode():
        for start in range(0, len(lists), chunk):
            q, c, m, f, _ = tensors(lists, np.arange(start, min(start + chunk, len(lists))), vectors, model.cfg.evidence)
            out.append(model(q, c, m, f if model.cfg.evidence else None).float().numpy())
    return np.concatenate(out) if out else np.zeros((0, lists.rows.shape[1]), np.float32)


def ips_dcg(scores: np.ndarray, lists: ClickLists) -> np.ndarray:
    """Per list: sum over its weighted targets of weight / log2(2 + 0-based rank under `scores`), the rank a stable
    sort by descending score gives (candidates scored higher, and equal ones earlier in the list). Only the targets'
    ranks are computed (a comparison of each target's row with its score: no sort; the memory's weight grid calls
    this tens of thousands of times)."""
    rows, cols = np.nonzero(lists.targets)
    out = np.zeros(len(scores))
    if not len(rows):
        return out
    rank = target_ranks(scores[rows], cols)  # scores[rows]: (n, K), one row per target
    np.add.at(out, rows, lists.targets[rows, cols] / np.log2(2.0 + rank))
    return out


def target_ranks(s: np.ndarray, cols: np.ndarray, before: np.ndarray | None = None) -> np.ndarray:
    """Per row of `s` ((n, K) scores), the 0-based rank of column `cols[i]` under a stable sort by descending score:
    the candidates scored higher, and equal ones earlier in the list (`before`: (n, K) True left of each target
    column, computed here when not given)."""
    mine = s[np.arange(len(cols)), cols][:, None]
    if before is None:
        before = np.arange(s.shape[1]) < cols[:, None]
    return np.count_nonzero(s > mine, axis=1) + np.count_nonzero((s == mine) & before, axis=1)


def loss_of(model: CMC, lists: ClickLists, picks, vectors: Vectors, teacher: CMC | None, weight: float):
    q, c, mask, f, targets = tensors(lists, picks, vectors, model.cfg.evidence)
    feats = f if model.cfg.evidence else None
    scores = model(q, c, mask, feats)  # (B, K)
    log_p = torch.log_softmax(scores, dim=1).masked_fill(~mask, 0.0)
    loss = -(targets * log_p).sum(dim=1).mean()
    if teacher is not None and weight:
        with torch.no_grad():
            target = torch.softmax(teacher(q, c, mask, feats), dim=1)
        loss = loss + weight * torch.nn.functional.kl_div(log_p, target, reduction="batchmean")
    return loss


def start_from(served: CMC, cfg: LearnConfig) -> CMC:
    """A copy of the served model; one without attention layers (the shipped fusion CMC) gets `n_layers` that
    start as the identity, so step 0 ranks exactly as the served model."""
    if served.cfg.n_layers or not served.cfg.evidence:
        return copy.deepcopy(served).float()
    from sieve.training.adapt import AdaptConfig, new_model

    return new_model(AdaptConfig(n_layers=cfg.n_layers, seed=cfg.seed), served.cfg.dim, served)


def train(cfg: LearnConfig, lists: ClickLists, validation: ClickLists, served: CMC, vectors: Vectors,
          log=print) -> tuple[CMC, dict]:
    from sieve.training.adapt import AdaptConfig, optimizer_for

    torch.manual_seed(cfg.seed)
    teacher = copy.deepcopy(served).float().eval()
    model = start_from(served, cfg)
    optimizer = optimizer_for(model, AdaptConfig(lr=cfg.lr, evidence_lr=cfg.evidence_lr))
    best = float(ips_dcg(scores_of(model, validation, vectors), validation).mean()) if len(validation) else 0.0
    record = {"history": [{"step": 0, "validation_ips_dcg": round(best, 4)}], "best_step": 0}
    best_weights = copy.deepcopy(model.state_dict())
    rng, began = np.random.default_rng(cfg.seed), time.monotonic()
    for step in range(1, cfg.steps + 1):
        model.train()
        picks = rng.choice(len(lists), size=min(cfg.batch, len(lists)), replace=False)
        loss = loss_of(model, lists, picks, vectors, teacher, cfg.teacher)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step % cfg.eval_every == 0 or step == cfg.steps) and len(validation):
            value = float(ips_dcg(scores_of(model, validation, vectors), validation).mean())
            record["history"].append({"step": step, "loss": round(loss.item(), 4), "validation_ips_dcg": round(value, 4)})
            if value > best:
                best, record["best_step"] = value, step
                best_weights = copy.deepcopy(model.state_dict())
    record["train_s"] = round(time.monotonic() - began, 1)
    log(f"trained {cfg.steps} steps in {record['train_s']} s; best validation IPS-DCG {best:.4f} at step {record['best_step']}")
    model.load_state_dict(best_weights)
    return model.eval(), record


def guard(new: CMC, served: CMC, heldout: ClickLists, vectors: Vectors, cfg: LearnConfig) -> dict:
    """The counterfactual comparison on held-out answers: mean IPS-DCG difference and its 95% bootstrap interval."""
    if len(heldout) == 0:
        return {"heldout_answers": 0, "delta": None, "interval": None}
    served_dcg = ips_dcg(scores_of(served, heldout, vectors), heldout)
    return {**compare(ips_dcg(scores_of(new, heldout, vectors), heldout) - served_dcg, cfg),
            "served_ips_dcg": round(float(served_dcg.mean()), 5)}


def compare(diff: np.ndarray, cfg: LearnConfig) -> dict:
    """Mean of per-answer differences (new - served) with its 95% bootstrap interval over answers."""
    rng = np.random.default_rng(cfg.seed + 1)
    means = np.array([diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(cfg.bootstrap)])
    return {"heldout_answers": int(len(diff)), "delta": round(float(diff.mean()), 5),
            "interval": [round(float(np.quantile(means, 0.025)), 5), round(float(np.quantile(means, 0.975)), 5)]}


def verdict(report: dict, best_step: int, cfg: LearnConfig) -> str | None:
    """Why the new model must not be published (None: publish)."""
    if report["heldout_answers"] < cfg.min_heldout:
        return (f"too little held-out feedback: {report['heldout_answers']} answers with clicks, the guard needs "
                f"{cfg.min_heldout}")
    if best_step == 0:
        return "no training step beat the served model on the validation answers"
    low = report["interval"][0]
    if low <= 0:
        return (f"not better than the served model on held-out feedback: IPS-DCG difference {report['delta']} with "
                f"95% interval {report['interval']} (the lower bound must be above 0)")
    return None


def config_dict(cfg: LearnConfig) -> dict:
    return asdict(cfg)
