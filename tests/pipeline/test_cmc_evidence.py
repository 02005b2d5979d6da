"""A CMC that fuses first-stage evidence: identity at start, features as documented, served through the real
Searcher over a hybrid index, and a trainer that learns a fusion a toy task rewards."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sieve.index import SearchIndex
from sieve.models.cmc import CMC, CMCConfig, randomize_gates
from sieve.models.cmc_checkpoint import CMCBundle, load_cmc, save_cmc
from sieve.pipeline.evidence import FEATURES, features, rank_feature
from sieve.pipeline.searcher import SearchParams, Searcher


def test_features_are_the_documented_columns():
    be = np.array([0.5, 0.9, 0.1], dtype=np.float32)
    bm25 = np.array([0.0, 2.0, 4.0], dtype=np.float32)
    f = features(be, bm25)
    assert f.shape == (3, len(FEATURES))
    assert f[:, 0] == pytest.approx(-np.log1p([0, 1, 2]))  # prior: first-stage position
    assert f[:, 1] == pytest.approx(-np.log1p([1, 0, 2]))  # be rank within the list
    assert f[:, 2] == pytest.approx(-np.log1p([2, 1, 0]))  # bm25 rank
    assert f[:, 3] == pytest.approx(be) and f[:, 4] == pytest.approx([0, 0.5, 1]) and f[:, 5].tolist() == [0, 1, 1]
    assert f[:, 6] == pytest.approx((be - be.mean()) / be.std(), abs=1e-6) and f[:, 7] == pytest.approx((bm25 - bm25.mean()) / bm25.std(), abs=1e-6)
    assert features(be, bm25, 6).shape == (3, 6)  # a model trained on the first six gets those six
    assert features(be, np.zeros(3))[:, 4].tolist() == [0, 0, 0]  # no term in common: no division by zero
    assert rank_feature(np.array([1.0, 1.0])) == pytest.approx([0, -np.log(2)])  # ties keep their order


def test_features_are_bit_for_bit_the_column_stack_they_were_trained_on():
    """Served features are computed column by column into one float32 array (and only the n asked for): exactly
    the float64 columns stacked and rounded once, as training made them."""
    def stacked(be, bm25, n):
        be, bm25 = be.astype(np.float64), np.nan_to_num(bm25.astype(np.float64))
        top = bm25.max(initial=0.0)
        def rank(v):
            r = np.empty(len(v))
            r[np.argsort(-v, kind="stable")] = np.arange(len(v))
            return -np.log1p(r)
        z = lambda v: (v - v.mean()) / v.std() if v.std() > 0 else np.zeros_like(v)  # noqa: E731
        cols = [-np.log1p(np.arange(len(be))), rank(be), rank(bm25), be, bm25 / top if top > 0 else 0 * bm25,
                (bm25 > 0).astype(np.float64), z(be), z(bm25)]
        return np.stack(cols[:n], axis=1).astype(np.float32)

    rng = np.random.default_rng(0)
    for k in (1, 2, 17, 512):
        be = np.round(rng.normal(size=k), 1).astype(np.float32)  # rounded: ties
        bm25 = np.where(rng.random(k) < 0.5, 0, rng.random(k) * 9).astype(np.float32)
        bm25[0] = np.nan if k > 2 else bm25[0]
        for n in (3, 6, len(FEATURES)):
            assert np.array_equal(features(be, bm25, n), stacked(be, bm25, n)), (k, n)


@pytest.mark.parametrize("gates", [False, True])
def test_an_untrained_evidence_cmc_ranks_exactly_as_the_first_stage(gates):
    torch.manual_seed(0)
    model = CMC(CMCConfig(dim=24, n_heads=4, evidence=len(FEATURES))).eval()
    if gates:  # even with layers that move the vectors: the interaction's weight starts at zero
        randomize_gates(model)
    k = 50
    cands = torch.nn.functional.normalize(torch.randn(2, k, 24), dim=-1)
    query = torch.nn.functional.normalize(torch.randn(2, 24), dim=-1)
    feats = torch.stack([torch.from_numpy(features(np.random.default_rng(i).normal(size=k),
                                                   np.random.default_rng(i + 9).exponential(size=k)))
                         for i in range(2)])
    with torch.inference_mode():
        scores = model(query, cands, None, feats)
    assert torch.equal(scores.argsort(dim=1, descending=True, stable=True), torch.arange(k).expand(2, k))
    with pytest.raises(AssertionError, match="evidence"):
        model(query, cands)


def test_evidence_cmc_is_served_over_hybrid_candidates(tmp_path, demo_index_dir, biencoder):
    """Round trip through a checkpoint; the stage computes the features; a model that only weighs bm25_norm
    ranks the hybrid list by BM25."""
    torch.manual_seed(0)
    model = CMC(CMCConfig(dim=biencoder.dim, evidence=len(FEATURES))).eval()
    with torch.no_grad():
        model.evidence.prior_weight.zero_()
        model.evidence.linear.weight[0, FEATURES.index("bm25_norm")] = 5.0
    save_cmc(CMCBundle(model.cfg, model, biencoder, None, "cmc-bm25-only", biencoder.weights_hash),
             tmp_path / "ckpt", towers_from_base=True, dtype=torch.float32)
    bundle = load_cmc(tmp_path / "ckpt", biencoder)
    assert bundle.config.evidence == len(FEATURES) and bundle.query_tower is biencoder
    with SearchIndex.load(demo_index_dir) as index:
        searcher = Searcher(biencoder, index, bundle)
        try:
            query = "volcano lava eruption"
            hybrid = searcher.search(SearchParams(query, top_k=20, retrieve_k=40, rerank="none", retriever="hybrid"))
            out = searcher.search(SearchParams(query, top_k=20, retrieve_k=40, rerank="cmc", retriever="hybrid"))
            assert sorted(out.candidates.rows.tolist()) == sorted(hybrid.candidates.rows.tolist())
            bm25 = out.candidates.scores["bm25"]
            assert np.all(np.diff(bm25[bm25 > 0]) <= 1e-6)  # by BM25, best first
            assert out.state.ran == ["retrieve", "cmc"]
            # with the be retriever the stage fetches BM25 from the index's lexical part itself
            be = searcher.search(SearchParams(query, top_k=10, retrieve_k=40, rerank="cmc", retriever="be"))
            top = index.lexical_scores(query)[be.candidates.rows]
            assert np.all(np.diff(top[top > 0]) <= 1e-6)
        finally:
            searcher.close()
