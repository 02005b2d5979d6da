"""The chunked low-precision attention (models/attention.py) computes what torch's fused kernel computes, whatever
the mask form and however it is chunked, the function mode routes only the calls it can take, and lowered modules
take that path on CPUs without AMX only."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sieve.models import attention, precision
from sieve.models.attention import LowPrecisionAttention, chunked_attention
from sieve.models.cmc import CMC, CMCConfig, randomize_gates
from sieve.models.precision import lowered


def qkv(B=3, H=2, Lq=5, Lk=7, E=8, Ev=4, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, L, e, generator=gen).to(dtype) for L, e in ((Lq, E), (Lk, E), (Lk, Ev)))


def masks(B=3, Lq=5, Lk=7):
    gen = torch.Generator().manual_seed(1)
    keys = torch.rand(B, 1, 1, Lk, generator=gen) > 0.4
    keys[..., 0] = True  # every row attends to something
    pairs = torch.rand(B, 1, Lq, Lk, generator=gen) > 0.3
    pairs[..., 0] = True
    return {"none": None, "bool keys": keys, "additive keys": torch.where(keys, 0.0, -1e9),
            "bool pairs": pairs, "bool shared": keys[:1]}


@pytest.mark.parametrize("chunk", [1 << 22, 70, 20], ids=["one chunk", "batch rows", "query rows"])
@pytest.mark.parametrize("mask", list(masks()))
def test_matches_torch_in_fp32(monkeypatch, chunk, mask):
    monkeypatch.setattr(attention, "CHUNK_SCORES", chunk)  # 70 = one batch row of scores; 20 splits query rows
    q, k, v = qkv()
    m = masks()[mask]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert torch.allclose(chunked_attention(q, k, v, m), expected, atol=1e-5)
    assert torch.allclose(chunked_attention(q, k, v, m, scale=0.3), F.scaled_dot_product_attention(
        q, k, v, attn_mask=m, scale=0.3), atol=1e-5)


def test_mode_routes_only_low_precision_cpu_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "chunked_attention", lambda *a, **k: calls.append(a[0].dtype) or a[0])
    with LowPrecisionAttention():
        q, k, v = qkv(Lk=attention.MIN_KEYS, dtype=torch.bfloat16)
        F.scaled_dot_product_attention(q, k, v)
        F.scaled_dot_product_attention(*qkv(Lk=attention.MIN_KEYS - 1, dtype=torch.bfloat16))  # short: torch's kernel
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)  # training-style calls keep torch's kernel
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.scaled_dot_product_attention(*qkv(Lk=attention.MIN_KEYS))  # fp32 keeps torch's kernel
    assert calls == [torch.bfloat16]


def test_bf16_cmc_scores_close_to_fp32_and_the_mode_is_used(monkeypatch):
    calls = []
    real_attention = attention.chunked_attention
    monkeypatch.setattr(attention, "chunked_attention", lambda *a, **k: calls.append(a[3]) or real_attention(*a, **k))
    model = randomize_gates(CMC(CMCConfig()).eval())
    gen = torch.Generator().manual_seed(2)
    query = torch.randn(2, 384, generator=gen)
    cands = F.normalize(torch.randn(2, 160, 384, generator=gen), dim=-1)  # over MIN_KEYS: the chunked path
    mask = torch.ones(2, 160, dtype=torch.bool)
    mask[1, 150:] = False  # padded candidates: a bool key mask reaches the attention
    with torch.inference_mode():
        reference = model(query, cands, mask)
        low = lowered(model, "bf16", only="layers", chunked_attention=True)(query, cands, mask)
    assert len(calls) == 2 and calls[0].dtype == torch.bool  # both layers, with the padding mask
    assert torch.isinf(low[1, 150:]).all() and torch.isfinite(low[1, :150]).all()
    assert (low[mask] - reference[mask]).abs().max() < 0.05 * reference[mask].abs().max()


def test_bf16_bert_takes_the_chunked_path_with_padding(monkeypatch, biencoder):
    """A Hugging Face BERT (the packaged bi-encoder, as a cross-encoder's body would) reaches the same path over long
    inputs, padding mask included; over short ones (under MIN_KEYS tokens) it keeps torch's kernel."""
    calls = []
    real_attention = attention.chunked_attention
    monkeypatch.setattr(attention, "chunked_attention", lambda *a, **k: calls.append(a[0].shape) or real_attention(*a, **k))
    texts = ["stars turn into red giants when their cores run out of hydrogen " * 20, "volcanoes erupt " * 40]
    inputs = biencoder.tokenize(texts, 256)
    assert not bool(inputs["attention_mask"].all()) and inputs["input_ids"].shape[1] >= attention.MIN_KEYS  # padded
    tower = lowered(biencoder.module, "bf16", chunked_attention=True)
    with torch.inference_mode():
        reference = biencoder.module(**inputs)
        low = tower(**inputs)
        assert len(calls) == 6  # one per layer
        tower(**biencoder.tokenize(["a short query"], 64))
    assert len(calls) == 6  # short: torch's kernel
    assert F.cosine_similarity(low, reference).min() > 0.99


@pytest.mark.parametrize("flags, chunked", [({"avx512_bf16", "avx512_vnni"}, True), ({"avx512_bf16", "amx_bf16"}, False),
                                            (set(), True)], ids=["avx512_bf16 (AMD)", "amx_bf16 (Intel)", "no flags"])
def test_lowered_modules_chunk_attention_only_without_amx(monkeypatch, flags, chunked):
    """Left to the CPU (chunked_attention=None, what every stage asks), bf16 attention runs chunked unless the CPU has
    AMX, where torch's fused kernel multiplies on AMX tiles; asked for explicitly, either way is kept."""
    calls = []
    real_attention = attention.chunked_attention
    monkeypatch.setattr(attention, "chunked_attention", lambda *a, **k: calls.append(1) or real_attention(*a, **k))
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    model = randomize_gates(CMC(CMCConfig()).eval())
    gen = torch.Generator().manual_seed(3)
    query, cands = torch.randn(1, 384, generator=gen), F.normalize(torch.randn(1, attention.MIN_KEYS, 384, generator=gen), dim=-1)
    with torch.inference_mode():
        reference = model(query, cands)
        low = lowered(model, "bf16", only="layers")
        assert all(layer.chunked_attention is chunked for layer in low.layers)
        scores = low(query, cands)
        assert len(calls) == (2 if chunked else 0)  # one call per CMC layer, or none
        lowered(model, "bf16", only="layers", chunked_attention=not chunked)(query, cands)
    assert len(calls) == 2
    assert precision.chunked_attention_pays() is chunked
    assert (scores - reference).abs().max() < 0.05 * reference.abs().max()
