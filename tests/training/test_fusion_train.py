"""training/fusion.py on synthetic lists: the unseen-document split holds what it promises, and training learns a
fusion the data rewards (relevance follows BM25, the first-stage order does not), selected on the dev lists."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sieve.evaluation.transfer import relevant
from sieve.pipeline.evidence import features
from sieve.training.fusion import FusionConfig, Lists, first_stage_ndcg, train, unseen_split


def test_unseen_split_keeps_dev_documents_out_of_training():
    qrels = {f"q{i}": {f"d{i}": 1, "shared": 1 if i < 3 else 0} for i in range(20)}
    train_ids, dev_ids = unseen_split(qrels, 5, seed=0)
    assert len(dev_ids) == 5 and not train_ids & dev_ids and train_ids | dev_ids == set(qrels)
    assert not dev_ids & {"q0", "q1", "q2"}  # they share a relevant document
    train_docs = relevant({q: qrels[q] for q in train_ids})
    assert all(not relevant({q: qrels[q]}) & train_docs for q in dev_ids)


def synthetic(name: str, n: int, seed: int, k: int = 30, dim: int = 24) -> Lists:
    """Lists in a first-stage order that ignores relevance; the relevant candidate has the highest BM25."""
    rng = np.random.default_rng(seed)
    out = Lists(name, [], [], [], [], [], [], {})
    for i in range(n):
        bm25 = rng.exponential(size=k).astype(np.float32)
        good = int(rng.integers(k))
        bm25[good] = bm25.max() + 1.0
        vectors = rng.normal(size=(k, dim)).astype(np.float32)
        query = rng.normal(size=dim).astype(np.float32)
        qid, ids = f"{name}{i}", [f"{name}{i}-{j}" for j in range(k)]
        out.ids.append(qid)
        out.query_vectors.append(query)
        out.vectors.append(vectors)
        out.features.append(features(vectors @ query, bm25))
        out.labels.append((np.arange(k) == good).astype(np.float32))
        out.doc_ids.append(ids)
        out.qrels[qid] = {ids[good]: 1}
    return out


@pytest.mark.parametrize("regime", ["linear", "mlp", "full"])
def test_training_learns_the_fusion_and_keeps_the_best_dev_state(regime):
    train_lists, dev = [synthetic("t", 64, 0)], [synthetic("d", 32, 1)]
    cfg = FusionConfig(regime=regime, steps=60, eval_every=20, batch_queries=16, lr=0.05, noise=0.0)
    model, result = train(cfg, train_lists, dev, dim=24, device=torch.device("cpu"), log=lambda _: None)
    start = first_stage_ndcg(dev)["macro"]
    assert result["start"]["macro"] == pytest.approx(start)  # an untrained model is the first stage
    assert result["best_dev_macro"] > start + 0.3 and result["best_step"] > 0
    assert model.evidence.linear.weight[0, 4] > 0  # bm25_norm learned as evidence of relevance
    if regime in ("linear", "mlp"):  # nothing that can name a candidate moved
        assert float(model.evidence.cmc_weight) == 0 and not model.evidence.embed.weight.any()
        assert len(model.layers) == 0
