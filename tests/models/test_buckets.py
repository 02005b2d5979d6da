"""Bucketed shapes (models/buckets.py) change no score: the query encoder and CMC padded to their buckets answer
what they answer unpadded. Streams and CUDA graphs are CUDA-only: on a CPU they are no-ops."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sieve.models.buckets import bucket, bucket_cmc, bucket_tokens
from sieve.models.cmc import CMC, CMCConfig, randomize_gates
from sieve.models.cmc_checkpoint import CMCBundle
from sieve.models.device import DeviceRuntime, graphed, own_stream
from sieve.pipeline.stages import CMCRerank
from sieve.service.config import Settings
from sieve.service.gpu_runtime import device_runtime

QUERIES = ["volcano", "how do volcanoes erupt and what comes out of them",
           "a much longer query about the history of bread baking in ancient Rome and Egypt, with yeast", "x y",
           "magma"]  # 5 queries: padded to a batch of 6


def test_bucket_grid():
    sizes = [bucket(n) for n in range(1, 3000)]
    assert all(s >= n for n, s in zip(range(1, 3000), sizes))
    assert all(s <= 1.5 * n for n, s in zip(range(2, 3000), sizes[1:]))  # padding adds at most half
    assert sorted(set(sizes))[:10] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert bucket(3, floor=8) == 8 and bucket(50, floor=8, cap=64) == 64 and bucket(70, cap=64) == 96
    with pytest.raises(ValueError):
        bucket(0)


def test_bucket_tokens_pads_with_a_zero_mask(biencoder):
    batch = biencoder.tokenize(QUERIES[:3], 64)
    B, T = batch["input_ids"].shape
    padded = bucket_tokens(batch, 64, pad_id=biencoder.tokenizer.pad_token_id)
    assert padded["input_ids"].shape == (bucket(B), bucket(T, floor=8, cap=64)) != (B, T)
    assert int(padded["attention_mask"].sum()) == int(batch["attention_mask"].sum())
    assert torch.equal(padded["input_ids"][:B, :T], batch["input_ids"])


def test_bucketed_query_encoder_equals_unbucketed(biencoder):
    before = biencoder.runtime
    try:
        plain = biencoder.encode_queries(QUERIES)  # (5, d)
        biencoder.runtime = DeviceRuntime(buckets=True)
        bucketed = biencoder.encode_queries(QUERIES)
        bucketed_three = biencoder.encode_queries(QUERIES[:3])  # 3 rows, a batch bucket of its own
    finally:
        biencoder.runtime = before
    assert bucketed.shape == plain.shape
    torch.testing.assert_close(bucketed, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bucketed_three, plain[:3], atol=1e-5, rtol=1e-5)


def _unit(*shape: int, seed: int) -> np.ndarray:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1).numpy()


@pytest.mark.parametrize("evidence", [0, 4])
def test_bucketed_cmc_equals_unbucketed(evidence):
    torch.manual_seed(1)
    cfg = CMCConfig(dim=64, n_heads=4, dropout=0.0, evidence=evidence)
    model = randomize_gates(CMC(cfg), scale=1.0).eval()
    if evidence:
        with torch.no_grad():
            for p in model.evidence.parameters():
                p.normal_(0, 0.3)
    tower = SimpleNamespace(device=torch.device("cpu"))  # CMCRerank reads only the query tower's device
    bundle = CMCBundle(cfg, model, tower, None, "test", "hash")
    stage = CMCRerank(bundle, index=None)
    lists = [_unit(k, 64, seed=k) for k in (5, 17, 40)]  # 3 queries -> bucket 3; 40 candidates -> 48
    feats = [np.random.default_rng(k).standard_normal((k, evidence)).astype(np.float32) for k in (5, 17, 40)]
    items = [(torch.from_numpy(_unit(64, seed=i)), c, None, f if evidence else None)
             for i, (c, f) in enumerate(zip(lists, feats))]
    plain = stage.compute(items)
    bundle.runtime = DeviceRuntime(buckets=True)
    bucketed = stage.compute(items)
    one_by_one = [stage.compute([item])[0] for item in items]  # 1 query, 5 -> 6 / 17 -> 24 / 40 -> 48 candidates
    for p, b, o in zip(plain, bucketed, one_by_one):
        assert b.shape == p.shape and np.isfinite(b).all()
        np.testing.assert_allclose(b, p, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(o, p, atol=1e-5, rtol=1e-5)


def test_bucket_cmc_shapes_and_mask():
    q, c = torch.zeros(5, 8), torch.ones(5, 13, 8)
    mask = torch.ones(5, 13, dtype=torch.bool)
    q2, c2, m2, e2 = bucket_cmc(q, c, mask, torch.ones(5, 13, 2))
    assert (q2.shape, c2.shape, m2.shape, e2.shape) == ((6, 8), (6, 16, 8), (6, 16), (6, 16, 2))
    assert int(m2.sum()) == 5 * 13 and not m2[5].any() and not m2[:, 13:].any()


def test_streams_and_graphs_are_no_ops_on_cpu():
    cpu = torch.device("cpu")
    module = torch.nn.Linear(2, 2)
    assert graphed(module, cpu, enabled=True) is module
    with own_stream(cpu, enabled=True):
        out = module(torch.ones(1, 2))
    assert out.shape == (1, 2)
    runtime = device_runtime(Settings(cuda_graphs=True, cuda_streams=True), cpu)
    assert runtime == DeviceRuntime()  # auto buckets: CUDA only; streams and graphs never on a CPU
    on = device_runtime(Settings(shape_buckets="on"), cpu)
    assert dataclasses.astuple(on) == (True, False, False)
