"""Train a CMC that fuses first-stage evidence (models/cmc.py `Evidence`) on candidates mined from the hybrid first
stage exactly as it is served, and select it on documents training never saw.

Data: one list per training query = the served hybrid candidates (the Searcher's own HybridRetrieve), their
bi-encoder vectors, their evidence features (pipeline/evidence.py) and graded labels. Selection: the macro nDCG@10
of the dev lists, where the dev lists are
  - an *unseen-document* dev split carved out of a training split: queries none of whose relevant documents is
    relevant to any query left for training (so a model that memorised relevant documents gains nothing there);
  - a dataset's own dev split, when it has one (NFCorpus).
Regimes, to see what guards against memorising documents:
  - "linear": only the evidence fusion (prior weight and one weight per feature) learns; the model has no
    attention layers and the interaction's weight stays 0: nothing in it can name a document (and it costs
    next to nothing to serve);
  - "mlp": as linear, plus a hidden layer over the features (a non-linear fusion; still nothing per document);
  - "full": the evidence embedding, the layers and their weight in the score learn too;
  - `noise` adds Gaussian noise to the candidate vectors in training (a regulariser aimed at memorising them).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from sieve.evaluation.metrics import mean_metric, ndcg_at_k
from sieve.evaluation.transfer import relevant
from sieve.models.cmc import CMC, CMCConfig
from sieve.pipeline.evidence import FEATURES, features
from sieve.pipeline.packing import pad_candidates, pad_lists
from sieve.pipeline.searcher import SearchParams

REGIMES = ("linear", "mlp", "full")


@dataclass
class FusionConfig:
    regime: str = "linear"
    depth: int = 100  # hybrid: top N of each list (the serving default, SIEVE_HYBRID_DEPTH)
    steps: int = 400
    batch_queries: int = 32
    lr: float = 3e-3  # evidence weights
    layer_lr: float = 1e-4  # attention layers (regime full)
    noise: float = 0.0  # std of Gaussian noise on candidate vectors in training
    eval_every: int = 50
    unseen_dev: int = 100  # queries carved out of each training split as its unseen-document dev split
    seed: int = 0

    def __post_init__(self):
        if self.regime not in REGIMES:
            raise ValueError(f"regime {self.regime!r} is not one of {REGIMES}")


@dataclass
class Lists:
    """Hybrid candidate lists of a set of queries (only queries with a relevant candidate keep their list)."""
    name: str
    ids: list[str]
    query_vectors: list[np.ndarray]  # (d,)
    vectors: list[np.ndarray]  # (K, d)
    features: list[np.ndarray]  # (K, F)
    labels: list[np.ndarray]  # (K,) grades
    doc_ids: list[list[str]]
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)


def unseen_split(qrels: dict[str, dict[str, int]], n: int, seed: int) -> tuple[set[str], set[str]]:
    """(train ids, dev ids): up to n dev queries, none of whose relevant documents is relevant to a train query."""
    ids = sorted(q for q in qrels if relevant({q: qrels[q]}))
    random.Random(seed).shuffle(ids)
    owners: dict[str, set[str]] = {}
    for q in ids:
        for doc in relevant({q: qrels[q]}):
            owners.setdefault(doc, set()).add(q)
    dev: set[str] = set()
    for q in ids:
        if len(dev) >= n:
            break
        if all(owners[doc] <= {q} for doc in relevant({q: qrels[q]})):  # its relevant documents are its own
            dev.add(q)
    return set(ids) - dev, dev


def mine(searcher, name: str, queries: dict[str, str], qrels: dict[str, dict[str, int]], depth: int,
         progress: bool = True) -> Lists:
    """The served hybrid candidates of each query, through the Searcher (retrieve_k = 2 x depth: the whole union)."""
    out = Lists(name, [], [], [], [], [], [], {})
    index = searcher.index
    for qid, text in tqdm(queries.items(), desc=f"mine {name}", unit="query", disable=not progress, leave=False):
        outcome = searcher.search(SearchParams(text, top_k=1, retrieve_k=min(2 * depth, index.size), rerank="none",
                                               retriever="hybrid", cmc_k=1))
        cands, state = outcome.state.candidates, outcome.state
        query = state.query_vectors["be"].float().cpu().numpy()
        vectors = index.embeddings(cands.rows)
        doc_ids = index.ids(cands.rows)
        labels = np.array([qrels[qid].get(d, 0) for d in doc_ids], dtype=np.float32)
        if not (labels > 0).any():
            continue
        out.ids.append(qid)
        out.query_vectors.append(query)
        out.vectors.append(vectors)
        out.features.append(features(vectors @ query, cands.scores["bm25"]))
        out.labels.append(labels)
        out.doc_ids.append(doc_ids)
        out.qrels[qid] = qrels[qid]
    return out


def batch(lists: Lists, picks: list[int], device, noise: float = 0.0, generator: torch.Generator | None = None):
    query, cands, mask = pad_candidates([torch.from_numpy(lists.query_vectors[i]) for i in picks],
                                        [lists.vectors[i] for i in picks], device)
    feats, _ = pad_lists([lists.features[i] for i in picks], device)
    labels, _ = pad_lists([lists.labels[i] for i in picks], device)
    if noise:
        cands = cands + noise * torch.randn(cands.shape, generator=generator).to(device)
    return query, cands, mask, feats, labels


def listwise_loss(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy between the softmax over each list and its graded targets (normalised grades)."""
    target = labels.clamp(min=0) * mask
    target = target / target.sum(dim=1, keepdim=True).clamp(min=1e-9)
    log_p = torch.log_softmax(scores.masked_fill(~mask, float("-inf")), dim=1)
    return -(target * log_p.masked_fill(~mask, 0.0)).sum(dim=1).mean()


def rank_lists(model: CMC, lists: Lists, device, chunk: int = 64) -> dict[str, list[str]]:
    rankings = {}
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(lists.ids), chunk):
            picks = list(range(start, min(start + chunk, len(lists.ids))))
            query, cands, mask, feats, _ = batch(lists, picks, device)
            scores = model(query, cands, mask, feats).float().cpu().numpy()
            for b, i in enumerate(picks):
                order = np.argsort(-scores[b, :len(lists.doc_ids[i])], kind="stable")
                rankings[lists.ids[i]] = [lists.doc_ids[i][j] for j in order]
    return rankings


def dev_ndcg(model: CMC, dev: list[Lists], device) -> dict[str, float]:
    out = {d.name: mean_metric(ndcg_at_k, rank_lists(model, d, device), d.qrels, 10) for d in dev}
    out["macro"] = float(np.mean([out[d.name] for d in dev]))
    return out


def first_stage_ndcg(dev: list[Lists]) -> dict[str, float]:
    """The hybrid order itself (what an untrained fusion CMC returns)."""
    out = {d.name: mean_metric(ndcg_at_k, dict(zip(d.ids, d.doc_ids)), d.qrels, 10) for d in dev}
    out["macro"] = float(np.mean([out[d.name] for d in dev]))
    return out


def new_model(cfg: FusionConfig, dim: int, init_layers: CMC | None = None) -> CMC:
    torch.manual_seed(cfg.seed)
    layers = CMCConfig.n_layers if cfg.regime == "full" else 0
    model = CMC(CMCConfig(dim=dim, evidence=len(FEATURES), n_layers=layers,
                          evidence_hidden=32 if cfg.regime == "mlp" else 0))
    if init_layers is not None and layers:
        model.layers.load_state_dict(init_layers.layers.state_dict())
    if cfg.regime in ("linear", "mlp"):
        for p in [*model.layers.parameters(), *model.evidence.embed.parameters(), model.evidence.cmc_weight]:
            p.requires_grad_(False)
    return model


def train(cfg: FusionConfig, train_lists: list[Lists], dev: list[Lists], dim: int, device,
          init_layers: CMC | None = None, log: Callable[[str], None] = print) -> tuple[CMC, dict]:
    """Returns the model at its best dev macro nDCG@10 (the start, an identity, counts too) and the history."""
    model = new_model(cfg, dim, init_layers).to(device)
    layer_params = {id(p) for p in model.layers.parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if id(p) not in layer_params], "lr": cfg.lr},
              {"params": [p for p in params if id(p) in layer_params], "lr": cfg.layer_lr}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=0.0)
    pool = [(li, i) for li, lists in enumerate(train_lists) for i in range(len(lists.ids))]
    rng = random.Random(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    start = dev_ndcg(model, dev, device)
    best = (start["macro"], 0, {k: v.detach().clone() for k, v in model.state_dict().items()})
    history = [{"step": 0, **start}]
    log(f"step 0: dev {start}")
    for step in tqdm(range(1, cfg.steps + 1), desc=f"train fusion ({cfg.regime})", unit="step", leave=False):
        model.train()
        picks = rng.sample(pool, min(cfg.batch_queries, len(pool)))
        losses = []
        for li, lists in enumerate(train_lists):  # one padded batch per dataset (lists of similar length)
            mine_ = [i for lj, i in picks if lj == li]
            if mine_:
                query, cands, mask, feats, labels = batch(lists, mine_, device, cfg.noise, generator)
                losses.append(listwise_loss(model(query, cands, mask, feats), labels, mask) * len(mine_))
        loss = torch.stack(losses).sum() / len(picks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            metrics = dev_ndcg(model, dev, device)
            history.append({"step": step, "loss": loss.item(), **metrics})
            if metrics["macro"] > best[0]:
                best = (metrics["macro"], step, {k: v.detach().clone() for k, v in model.state_dict().items()})
            log(f"step {step}: loss {loss.item():.4f} dev {metrics}")
    model.load_state_dict(best[2])
    model.eval()
    return model, {"best_step": best[1], "best_dev_macro": best[0], "start": start, "history": history,
                   "config": asdict(cfg)}
