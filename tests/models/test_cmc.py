"""CMC invariants on the real module: permutation equivariance, padding, identity at init, batching, K=16,384."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sieve.models.cmc import CMC, CMCConfig, randomize_gates
from sieve.models.cmc_checkpoint import load_cmc, save_cmc, untrained_cmc


def unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


@pytest.fixture()
def trained_like() -> CMC:
    """Random layers with open gates: a CMC that is far from the identity, like a trained one."""
    torch.manual_seed(1)
    return randomize_gates(CMC(CMCConfig(dim=64, n_heads=4, dropout=0.0)), scale=1.0).eval()


def test_shuffling_candidates_permutes_scores(trained_like):
    q, c = unit(1, 64, seed=0), unit(1, 50, 64, seed=1)
    perm = torch.randperm(50, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        base, shuffled = trained_like(q, c)[0], trained_like(q, c[:, perm])[0]
    torch.testing.assert_close(shuffled, base[perm], atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_scores(trained_like):
    q, c = unit(1, 64, seed=3), unit(1, 20, 64, seed=4)
    padded = torch.cat([c, unit(1, 12, 64, seed=5) * 7], dim=1)  # junk in the padding slots
    mask = torch.zeros(1, 32, dtype=torch.bool)
    mask[:, :20] = True
    with torch.inference_mode():
        alone, with_pad = trained_like(q, c)[0], trained_like(q, padded, mask)[0]
    torch.testing.assert_close(with_pad[:20], alone, atol=1e-5, rtol=1e-5)
    assert torch.isinf(with_pad[20:]).all() and (with_pad[20:] < 0).all()


def test_batch_equals_one_by_one(trained_like):
    sizes = [5, 17, 9]
    qs = [unit(1, 64, seed=10 + i) for i in range(3)]
    cs = [unit(1, k, 64, seed=20 + i) for i, k in enumerate(sizes)]
    batch = torch.zeros(3, max(sizes), 64)
    mask = torch.zeros(3, max(sizes), dtype=torch.bool)
    for i, (c, k) in enumerate(zip(cs, sizes)):
        batch[i, :k], mask[i, :k] = c[0], True
    with torch.inference_mode():
        together = trained_like(torch.cat(qs), batch, mask)
        for i, k in enumerate(sizes):
            torch.testing.assert_close(together[i, :k], trained_like(qs[i], cs[i])[0], atol=1e-5, rtol=1e-5)


def test_untrained_layers_are_the_identity():
    model = CMC(CMCConfig(dim=64, n_heads=4)).eval()
    q, c = unit(2, 64, seed=6), unit(2, 30, 64, seed=7)
    with torch.inference_mode():
        scores = model(q, c)
    torch.testing.assert_close(scores, torch.einsum("bd,bkd->bk", q, c))


def test_trained_like_model_is_not_the_identity(trained_like):
    """Guards the invariant tests above: they must run on a model that actually mixes candidates."""
    q, c = unit(1, 64, seed=8), unit(1, 30, 64, seed=9)
    with torch.inference_mode():
        scores = trained_like(q, c)
    assert not torch.allclose(scores, torch.einsum("bd,bkd->bk", q, c), atol=1e-2)


def test_cmc_runs_16384_candidates():
    model = randomize_gates(CMC(CMCConfig(dropout=0.0))).eval()
    q, c = unit(1, 384, seed=11), unit(1, 16384, 384, seed=12)
    with torch.inference_mode():
        scores = model(q, c)
    assert scores.shape == (1, 16384) and torch.isfinite(scores).all()


def test_untrained_cmc_ranks_as_the_biencoder(biencoder):
    bundle = untrained_cmc(biencoder)
    query = "How do vaccines train the immune system?"
    docs = ["Vaccines expose the immune system to antigens so it builds memory cells.",
            "The Roman Senate met in the Curia.", "Antibodies neutralise pathogens after immunisation.",
            "Sourdough needs a lively starter.", "Immune memory after vaccination can last decades."]
    q_be = biencoder.encode_queries([query])
    cands = torch.from_numpy(biencoder.encode_documents(docs, progress=False))
    be_scores = (cands @ q_be[0]).tolist()
    with torch.inference_mode():
        cmc_scores = bundle.model(bundle.query_tower.encode_queries([query]), cands[None])[0].tolist()
    assert sorted(range(5), key=lambda i: -cmc_scores[i]) == sorted(range(5), key=lambda i: -be_scores[i])
    assert cmc_scores == pytest.approx(be_scores, abs=1e-5)


def test_checkpoint_round_trip_reproduces_scores(biencoder, tmp_path):
    bundle = untrained_cmc(biencoder)
    randomize_gates(bundle.model, seed=3)
    q = bundle.query_tower.encode_queries(["heart attack symptoms"])
    c = unit(1, 40, 384, seed=13)
    with torch.inference_mode():
        before = bundle.model(q, c)
    loaded = load_cmc(save_cmc(bundle, tmp_path / "cmc"), biencoder)
    with torch.inference_mode():
        after = loaded.model(loaded.query_tower.encode_queries(["heart attack symptoms"]), c)
    torch.testing.assert_close(after, before, atol=2e-2, rtol=2e-2)  # fp16 on disk
    assert loaded.config == bundle.config


def test_shared_checkpoint_refuses_another_biencoder(biencoder, tmp_path):
    bundle = untrained_cmc(biencoder)
    bundle.base_model_hash = "0" * 64
    with pytest.raises(ValueError, match="shared mode"):
        load_cmc(save_cmc(bundle, tmp_path / "cmc"), biencoder)


def test_layers_only_checkpoint_takes_towers_from_the_biencoder(biencoder, tmp_path):
    bundle = untrained_cmc(biencoder)
    randomize_gates(bundle.model, seed=4)
    path = save_cmc(bundle, tmp_path / "cmc", towers_from_base=True)
    assert not (path / "query_tower").exists()
    loaded = load_cmc(path, biencoder)
    assert loaded.query_tower is biencoder
    c = unit(1, 10, 384, seed=14)
    q = biencoder.encode_queries(["lava flows"])
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(q, c), bundle.model(q, c), atol=2e-2, rtol=2e-2)
