"""The bi-encoder's document tower in lower precision (SIEVE_DOC_PRECISION, models/precision_stages.py): what this
CPU picks and why, vectors close to fp32's, the fp32 default of `encode` untouched, each precision's vectors apart in
the embedding cache, and batches tokenized ahead of the forward giving the vectors of one batch at a time."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sieve.index.cache import cache_key
from sieve.models.precision import MIN_SPEARMAN, lowered, native_bf16
from sieve.models.precision_stages import document_probe, lower_document_tower
from sieve.models.text_encoder import TextEncoder
from sieve.service.components import lower_documents
from sieve.service.config import Settings
from tests.conftest import ordinary_passages


@pytest.fixture
def encoder(biencoder):
    """The session's bi-encoder with its own document tower: nothing here changes the fixture's."""
    copy = TextEncoder(biencoder.module, biencoder.tokenizer, name=biencoder.name, weights_hash=biencoder.weights_hash,
                       lengths=biencoder.lengths, batch_size=4)
    return copy


def test_either_fp32_setting_keeps_documents_in_fp32(encoder):
    for updates, reason in (({"precision": "fp32", "doc_precision": "auto"}, "SIEVE_PRECISION=fp32"),
                            ({"precision": "auto", "doc_precision": "fp32"}, "SIEVE_DOC_PRECISION=fp32")):
        record = lower_documents(Settings(**updates), encoder)
        assert (record["dtype"], record["reason"]) == ("fp32", reason)
        assert encoder.doc_module is encoder.module and encoder.doc_precision == "fp32"


def test_auto_picks_what_this_cpu_has_and_keeps_the_probe_rankings(encoder):
    module, choice = lower_document_tower(encoder, "auto")
    assert choice.dtype == ("bf16" if native_bf16() else "fp32"), choice  # never int8: the towers lose rankings there
    if choice.dtype == "bf16":
        assert module is not encoder.module and choice.spearman >= MIN_SPEARMAN
    else:
        assert module is encoder.module


def test_lowered_documents_are_close_to_fp32_and_encode_stays_fp32(encoder):
    texts = ordinary_passages(10)
    fp32 = encoder.encode_documents(texts, progress=False)
    encoder.doc_module, encoder.doc_precision = lowered(encoder.module, "bf16"), "bf16"  # emulated where not native
    low = encoder.encode_documents(texts, progress=False)
    assert not np.array_equal(low, fp32)  # the lowered tower did encode them
    cosine = (low * fp32).sum(1) / np.linalg.norm(low, axis=1) / np.linalg.norm(fp32, axis=1)
    assert cosine.min() > 0.999, cosine
    np.testing.assert_array_equal(encoder.encode(texts, encoder.lengths.doc_max_length), fp32)  # `encode`: fp32
    probe = document_probe(encoder)
    assert probe(encoder.module).shape == (8, 16)


def test_the_cache_keeps_each_precision_apart(encoder):
    texts = ["a b", "c d"]

    class Before:  # an encoder as it was before doc_precision: its keys are fp32's
        name, weights_hash, max_length = encoder.name, encoder.weights_hash, encoder.max_length

    fp32 = cache_key(encoder, texts)
    assert fp32 == cache_key(Before(), texts)
    encoder.doc_precision = "bf16"
    assert cache_key(encoder, texts) != fp32


def test_batches_tokenized_ahead_give_each_text_its_own_vector(encoder):
    texts = ordinary_passages(11)  # batches of 4: three, the last short, in order of length
    together = encoder.encode(texts, encoder.lengths.doc_max_length)
    alone = np.concatenate([encoder.encode([t], encoder.lengths.doc_max_length) for t in texts])
    np.testing.assert_allclose(together, alone, atol=2e-6)
    assert encoder.encode([], encoder.lengths.doc_max_length).shape == (0, encoder.dim)
