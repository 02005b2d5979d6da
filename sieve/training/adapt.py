"""`sieve adapt`: train the attention CMC on an index's own documents, from pseudo-queries alone.

Each pseudo-query (training/pseudo_queries.py) has its source document as the one positive among the candidates
the served hybrid first stage gives it (training/adapt_data.py). The model is the CMC of models/cmc.py with the
first-stage evidence kept as inputs, started from the shipped fusion CMC's weights (the attention layers start as
the identity and their weight in the score at 0), so step 0 ranks exactly as the shipped default.

The loss is the source's softmax cross-entropy plus `teacher` x KL(shipped default || model) over the whole list
(self-training: the default's ranking of the other candidates, which may be relevant too, is a soft target).

Selection never sees a real query: documents are split first, and the model kept is the one whose pseudo-queries
of *held-out* documents (never trained on) rank their source highest (MRR@10). The guard (`verdict`): a model
that ranks those held-out pseudo-queries below the first stage or below the shipped default, or that no training
step improved (the start itself), is not installed.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from sieve.models.cmc import CMC
from sieve.training.adapt_config import AdaptConfig  # noqa: F401 (re-exported: the trainer's config)
from sieve.training.adapt_data import Lists, write_json
from sieve.training.choices import STARTS  # noqa: F401 (re-exported)

def verdict(heldout: dict, best_step: int) -> str | None:
    """Why the adapted model must not be installed (None: install it). `heldout`: evaluate() of the first stage,
    the shipped default and the adapted model on the held-out documents' pseudo-queries."""
    adapted = heldout["adapted"]["mrr@10"]
    for name in ("first_stage", "shipped_default"):
        if adapted < heldout[name]["mrr@10"]:
            return (f"on the held-out documents' pseudo-queries it ranks below the {name.replace('_', ' ')} (MRR@10 "
                    f"{adapted} < {heldout[name]['mrr@10']})")
    if best_step == 0:
        return "no training step beat the model it started from on the held-out documents' pseudo-queries"
    return None


def new_model(cfg: AdaptConfig, dim: int, fusion: CMC | None) -> CMC:
    torch.manual_seed(cfg.seed)
    model = CMC(cfg.model_config(dim))
    if cfg.start == "fusion" and fusion is not None:
        missing, unexpected = model.load_state_dict(fusion.state_dict(), strict=False)
        assert not unexpected, f"the fusion CMC has weights this model lacks: {unexpected}"
    return model


def batch(lists: Lists, picks: np.ndarray, vectors: torch.Tensor, device, width: int | None = None) -> tuple:
    """Padded tensors for the lists `picks` (their first `width` candidates): query (B, d), candidates (B, K, d),
    mask (B, K), features (B, K, F), positive position (B,)."""
    sub = lists.select(picks)
    width = min(int(sub.lengths.max()), width or lists.rows.shape[1])
    rows = torch.from_numpy(sub.rows[:, :width].astype(np.int64))
    mask = rows >= 0
    cands = vectors[rows.clamp(min=0)]  # (B, K, d)
    positive = torch.from_numpy(sub.positive.astype(np.int64))
    cands[torch.arange(len(picks)), positive] = torch.from_numpy(sub.source_vectors)  # the source as training sees it
    return (torch.from_numpy(sub.query_vectors).to(device), cands.to(device), mask.to(device),
            torch.from_numpy(sub.features[:, :width]).to(device), torch.from_numpy(sub.positive.astype(np.int64)).to(device))


def loss_of(model: CMC, lists: Lists, picks: np.ndarray, vectors: torch.Tensor, device, width: int,
            teacher: CMC | None = None, teacher_weight: float = 0.0) -> torch.Tensor:
    """Cross-entropy of the source document among the list, plus `teacher_weight` x KL(teacher || model) over the
    whole list: the teacher's soft ranking of the other candidates (which may be relevant too: a pseudo-query has
    one known positive, not the only one) holds the model near it where the pseudo-query says nothing."""
    query, cands, mask, feats, positive = batch(lists, picks, vectors, device, width)
    scores = model(query, cands, mask, feats)  # (B, K), -inf on padding
    loss = torch.nn.functional.cross_entropy(scores, positive)
    if teacher is None or not teacher_weight:
        return loss
    with torch.no_grad():
        target = torch.softmax(teacher(query, cands, mask, feats), dim=1)  # 0 on padding
    log_p = torch.log_softmax(scores, dim=1).masked_fill(~mask, 0.0)  # padding: 0 x -inf would be nan
    return loss + teacher_weight * torch.nn.functional.kl_div(log_p, target, reduction="batchmean")


def source_ranks(model: CMC | None, lists: Lists, vectors: torch.Tensor, device, chunk: int = 32) -> np.ndarray:
    """0-based rank of each list's source document under `model` (None: the first-stage order)."""
    if model is None:
        return lists.positive.astype(np.int64)
    model.eval()
    ranks = []
    with torch.inference_mode():
        for start in range(0, len(lists), chunk):
            picks = np.arange(start, min(start + chunk, len(lists)))
            query, cands, mask, feats, positive = batch(lists, picks, vectors, device)
            scores = model(query, cands, mask, feats)
            target = scores.gather(1, positive[:, None])
            ranks.append((scores > target).sum(dim=1).cpu().numpy())
    return np.concatenate(ranks) if ranks else np.zeros(0, np.int64)


def mrr_at_10(ranks: np.ndarray) -> float:
    return float(np.mean(np.where(ranks < 10, 1.0 / (ranks + 1), 0.0))) if len(ranks) else 0.0


def evaluate(model: CMC | None, lists: Lists, vectors: torch.Tensor, device) -> dict:
    ranks = source_ranks(model, lists, vectors, device)
    return {"mrr@10": round(mrr_at_10(ranks), 4), "hit@1": round(float(np.mean(ranks == 0)), 4) if len(ranks) else 0.0,
            "queries": int(len(ranks))}


class TrainState:
    """Model, optimizer and progress, saved as safetensors + JSON after every evaluation (resumable)."""

    def __init__(self, work: Path):
        self.weights, self.meta = work / "train.safetensors", work / "train.json"

    def save(self, model: CMC, optimizer, best: dict, meta: dict) -> None:
        tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        tensors.update({f"best.{k}": v.detach().cpu().contiguous() for k, v in best.items()})
        for i, (param, state) in enumerate((p, optimizer.state[p]) for g in optimizer.param_groups for p in g["params"]):
            for name, value in state.items():
                tensors[f"optim.{i}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
        tmp = self.weights.with_name(self.weights.name + ".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(self.weights)
        write_json(self.meta, meta)

    def load(self, model: CMC, optimizer) -> tuple[dict, dict] | None:
        import json

        if not (self.weights.is_file() and self.meta.is_file()):
            return None
        tensors = load_file(str(self.weights))
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")}
        for i, param in enumerate(p for g in optimizer.param_groups for p in g["params"]):
            state = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"optim.{i}.")}
            if state:
                optimizer.state[param] = state
        return best, json.loads(self.meta.read_text())


def optimizer_for(model: CMC, cfg: AdaptConfig):
    evidence_names = ("evidence.linear", "evidence.mlp", "evidence.prior_weight")
    fused = [p for n, p in model.named_parameters() if n.startswith(evidence_names)]
    rest = [p for n, p in model.named_parameters() if not n.startswith(evidence_names)]
    if cfg.evidence_lr == 0:
        for p in fused:
            p.requires_grad_(False)
    groups = [{"params": rest, "lr": cfg.lr}] + ([{"params": fused, "lr": cfg.evidence_lr}] if cfg.evidence_lr else [])
    return torch.optim.AdamW(groups, weight_decay=0.01)


def train(cfg: AdaptConfig, train_lists: Lists, heldout: Lists, vectors: torch.Tensor, device, fusion: CMC | None,
          work: Path, deadline: float | None = None, log: Callable[[str], None] = print,
          progress: bool = True) -> tuple[CMC, dict]:
    """The model at its best held-out MRR@10 (step 0, the start, counts too) and the training record."""
    train_lists = train_lists.select(np.flatnonzero(train_lists.positive < cfg.train_k))
    model = new_model(cfg, vectors.shape[1], fusion).to(device)
    teacher = fusion.to(device).eval() if cfg.teacher and fusion is not None else None
    optimizer = optimizer_for(model, cfg)
    state = TrainState(work)
    resumed = state.load(model, optimizer)
    if resumed is not None:
        best_weights, record = resumed
        log(f"resuming at step {record['step']} (best held-out MRR@10 {record['best']['mrr@10']} at step "
            f"{record['best_step']})")
    else:
        start = evaluate(model, heldout, vectors, device)
        best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        record = {"step": 0, "best": start, "best_step": 0, "history": [{"step": 0, **start}], "train_s": 0.0}
    rng = np.random.default_rng(cfg.seed + record["step"])
    bar = tqdm(total=cfg.steps, initial=record["step"], desc="adapt CMC", unit="step", disable=not progress)
    began = time.monotonic() - record["train_s"]
    for step in range(record["step"] + 1, cfg.steps + 1):
        if deadline is not None and time.monotonic() > deadline:
            log(f"time budget reached at step {step - 1}")
            break
        model.train()
        picks = rng.choice(len(train_lists), size=min(cfg.batch_queries, len(train_lists)), replace=False)
        loss = loss_of(model, train_lists, picks, vectors, device, cfg.train_k, teacher, cfg.teacher)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", best=record["best"]["mrr@10"])
        if step % cfg.eval_every == 0 or step == cfg.steps:
            metrics = evaluate(model, heldout, vectors, device)
            record["history"].append({"step": step, "loss": round(loss.item(), 4), **metrics})
            if metrics["mrr@10"] > record["best"]["mrr@10"]:
                record["best"], record["best_step"] = metrics, step
                best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
            record["step"], record["train_s"] = step, time.monotonic() - began
            state.save(model, optimizer, best_weights, record)
    bar.close()
    record["config"] = asdict(cfg)
    model.load_state_dict(best_weights)
    return model.eval(), record
