"""A CMC that is an MLP over the first-stage evidence (no attention layers, interaction weight 0: the shipped
cmc-fusion-mlp) scores from the features alone: the stage gathers, pads and moves no candidate vectors for it, and
its scores are exactly the ones the vectors would give (models/cmc.py reads_candidates)."""
from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import sieve
from sieve.index import SearchIndex
from sieve.models.buckets import bucket_cmc
from sieve.models.cmc import CMC, CMCConfig, randomize_gates
from sieve.models.cmc_checkpoint import CMCBundle, load_cmc
from sieve.models.device import DeviceRuntime
from sieve.pipeline.evidence import FEATURES
from sieve.pipeline.first_stage import HybridRetrieve
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.stages import CMCRerank, Retrieve
from sieve.pipeline.state import QueryState

SHIPPED = Path(sieve.__file__).parent / "checkpoints" / "cmc-fusion"


def evidence_mlp(dim: int = 24, seed: int = 0) -> CMC:
    """Every weight random except the interaction's, which is 0 as in the shipped checkpoint."""
    torch.manual_seed(seed)
    model = CMC(CMCConfig(dim=dim, n_layers=0, evidence=len(FEATURES), evidence_hidden=8)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
        model.evidence.cmc_weight.zero_()
    return model


def inputs(B=3, K=7, d=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, K, dtype=torch.bool)
    mask[1, 4:] = False  # a shorter list in the batch
    return (torch.randn(B, d, generator=g), torch.randn(B, K, d, generator=g), mask,
            torch.randn(B, K, len(FEATURES), generator=g))


def test_the_shipped_fusion_cmc_reads_no_vectors(biencoder):
    assert load_cmc(SHIPPED, biencoder).model.reads_candidates() is False


def test_what_reads_the_vectors():
    assert evidence_mlp().reads_candidates() is False
    with_weight = evidence_mlp()
    with torch.no_grad():
        with_weight.evidence.cmc_weight.fill_(0.25)
    assert with_weight.reads_candidates() is True
    assert CMC(CMCConfig(dim=24, n_layers=1, evidence=len(FEATURES))).reads_candidates() is True  # attention
    assert CMC(CMCConfig(dim=24, n_layers=0)).reads_candidates() is True  # the paper's: scores are <q, c>


def test_scores_without_the_vectors_are_the_scores_with_them():
    model = evidence_mlp()
    query, cands, mask, feats = inputs()
    with torch.inference_mode():
        want = model(query, cands, mask, feats)
        got = model(None, None, mask, feats)
        bucketed = model(*bucket_cmc(None, None, mask, feats))
        bucketed_want = model(*bucket_cmc(query, cands, mask, feats))  # the same padded shape, with the vectors
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(bucketed, bucketed_want, rtol=0, atol=0)
    torch.testing.assert_close(bucketed[:3, :7], want, rtol=1e-6, atol=1e-6)
    assert torch.isinf(got[1, 4:]).all() and torch.isfinite(got[1, :4]).all()


def test_a_model_that_reads_vectors_refuses_none():
    model = randomize_gates(CMC(CMCConfig(dim=24, n_layers=1, evidence=len(FEATURES))).eval())
    query, cands, mask, feats = inputs()
    with pytest.raises(AssertionError, match="reads its candidates' vectors"):
        model(None, None, mask, feats)


@pytest.mark.parametrize("buckets", [False, True])
def test_the_stage_gathers_nothing_and_ranks_as_with_the_vectors(demo_index_dir, biencoder, buckets):
    model = evidence_mlp(dim=biencoder.dim)
    bundle = CMCBundle(model.cfg, model, biencoder, None, "cmc-mlp-test", biencoder.weights_hash,
                       runtime=DeviceRuntime(buckets=buckets))
    queries = ["how do volcanoes erupt", "ocean tides and the moon", "black holes"]
    with SearchIndex.load(demo_index_dir) as index:
        free, reading = CMCRerank(bundle, index), CMCRerank(bundle, index)
        reading.reads_vectors = True  # the same model, made to take the vectors as before
        assert free.reads_vectors is False
        items, reference = [], []
        for query in queries:
            vector = biencoder.encode_queries([query])[0]
            state = HybridRetrieve(index, 20)(QueryState(query, query_vectors={"be": vector, "cmc": vector}))
            items.append(free.prepare(state))
            reference.append(reading.prepare(state))
        assert all(item[0] is None and item[1] is None for item in items)  # no query vector, no candidates
        assert all(item[1] is not None for item in reference)
        for got, want in zip(free.compute(items), reading.compute(reference)):
            np.testing.assert_array_equal(got, want)
            assert len(got) == 20


def test_each_model_is_asked_once(biencoder):
    """Stages are built per request: the weight read behind reads_candidates (a device wait on CUDA) happens once."""
    model = evidence_mlp(dim=biencoder.dim)
    asked = []
    model.reads_candidates = lambda: asked.append(1) or False
    bundle = CMCBundle(model.cfg, model, biencoder, None, "cmc-mlp-test", biencoder.weights_hash)
    stages = [CMCRerank(bundle, None) for _ in range(3)]
    assert [stage.reads_vectors for stage in stages] == [False] * 3 and len(asked) == 1
    other = evidence_mlp(dim=biencoder.dim)  # a swapped-in model is asked afresh
    assert CMCRerank(CMCBundle(other.cfg, other, biencoder, None, "x", biencoder.weights_hash), None).reads_vectors is False


def be_first_stage(index, biencoder, query: str, k: int, same_vector: bool = True) -> QueryState:
    vector = biencoder.encode_queries([query])[0]
    state = QueryState(query, query_vectors={"be": vector, "cmc": vector if same_vector else vector.clone()})
    return Retrieve(index, k)(state)


def test_after_the_be_retriever_the_evidence_reads_its_scores_not_the_vectors(demo_index_dir, biencoder,
                                                                               monkeypatch):
    """The `be` retriever's scores are the inner products CMC's `be` evidence needs: the stage takes them from there
    (the same features to float32 rounding, the same ranking) and reads no candidate vector for them."""
    bundle = load_cmc(SHIPPED, biencoder)
    queries = ["how do volcanoes erupt", "ocean tides and the moon", "black holes"]
    with SearchIndex.load(demo_index_dir) as index:
        stage = CMCRerank(bundle, index)
        states = [be_first_stage(index, biencoder, q, index.size) for q in queries]
        assert all(s.candidates.inner_products == "retrieve" for s in states)
        reference = []
        for state in states:  # as before: the inner products computed from the gathered vectors
            blind = copy.copy(state)
            blind.candidates = replace(state.candidates, inner_products=None)
            reference.append(stage.prepare(blind))
        monkeypatch.setattr(index, "embeddings", lambda *_, **__: pytest.fail("a candidate vector was read"))
        monkeypatch.setattr(index, "embeddings_into", lambda *_, **__: pytest.fail("a candidate vector was read"),
                            raising=False)
        items = [stage.prepare(state) for state in states]
        for got, want in zip(items, reference):
            np.testing.assert_allclose(got[3], want[3], rtol=0, atol=2e-6)  # the evidence features
        for got, want, state in zip(stage.compute(items), stage.compute(reference), states):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
            assert len(got) == len(state.candidates) == index.size
            np.testing.assert_array_equal(np.argsort(-got, kind="stable"), np.argsort(-want, kind="stable"))


def test_a_cmc_query_vector_of_its_own_reads_the_vectors(demo_index_dir, biencoder):
    """Where CMC's query vector is not the one the retriever searched with, the scores are not its inner products:
    the vectors are read as before."""
    bundle = load_cmc(SHIPPED, biencoder)
    with SearchIndex.load(demo_index_dir) as index:
        read = []
        embeddings = index.embeddings
        index.embeddings = lambda rows, **kw: read.append(len(rows)) or embeddings(rows, **kw)
        CMCRerank(bundle, index).prepare(be_first_stage(index, biencoder, "black holes", 8, same_vector=False))
    assert read == [8]


def test_the_marker_follows_the_candidates_through_takes_and_new_columns():
    cands = Candidates(rows=np.arange(4), scores={"retrieve": np.arange(4, dtype=np.float32)}, inner_products="retrieve")
    assert cands.take(np.array([2, 0])).inner_products == "retrieve"
    assert cands.with_scores("cmc", np.zeros(4)).inner_products == "retrieve"
    assert cands.rerank_head("cmc", np.array([0.0, 1.0])).inner_products == "retrieve"
