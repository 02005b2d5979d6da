"""The bi-encoder against the reference implementation of the model it wraps, and the cross-encoder's pair
tokenisation and loading from a local checkpoint directory."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.models.weights import default_model_path, weights_hash

TEXTS = ["A man is eating food.", "The new movie is awesome",
         "Mitochondria are the powerhouse of the cell, producing ATP through oxidative phosphorylation. " * 3, "x"]


def test_biencoder_matches_sentence_transformers(biencoder):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(default_model_path()), device="cpu").encode(TEXTS, normalize_embeddings=True)
    ours = biencoder.encode(TEXTS, max_length=256)
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_length_sorted_batches_keep_input_order(biencoder):
    one_by_one = np.stack([biencoder.encode([t], max_length=256)[0] for t in TEXTS])
    np.testing.assert_allclose(biencoder.encode(TEXTS, max_length=256), one_by_one, atol=1e-5)


def test_query_and_document_lengths_differ(biencoder):
    long_text = " ".join(["protein"] * 400)
    q = biencoder.encode_queries([long_text])
    assert biencoder.tokenize([long_text], biencoder.lengths.query_max_length)["input_ids"].shape[1] == 64
    assert biencoder.tokenize([long_text], biencoder.max_length)["input_ids"].shape[1] == 256
    assert q.shape == (1, 384)


@pytest.fixture(scope="module")
def ce_checkpoint(tmp_path_factory):
    """An (untrained) cross-encoder directory made from the packaged MiniLM weights, as a user's would be."""
    path = tmp_path_factory.mktemp("ce")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=1)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(str(default_model_path())).save_pretrained(path)
    return path


def test_cross_encoder_loads_and_scores_pairs(ce_checkpoint):
    ce = CrossEncoder.from_pretrained(ce_checkpoint, batch_size=2)
    scores = ce.score("what do mitochondria do", TEXTS)
    assert scores.shape == (4,) and torch.isfinite(scores).all()
    assert ce.weights_hash == weights_hash(ce_checkpoint)
    singles = torch.cat([ce.score("what do mitochondria do", [t]) for t in TEXTS])
    torch.testing.assert_close(scores, singles, atol=1e-4, rtol=1e-4)


def test_cross_encoder_truncates_query_then_pair(ce_checkpoint):
    ce = CrossEncoder.from_pretrained(ce_checkpoint, lengths=PairLengths(query_max_length=8, max_length=32))
    batch = ce.tokenize_pairs("one two three four five six seven eight nine ten eleven", ["word " * 100])
    segment_a = int((batch["token_type_ids"][0] == 0).sum())
    assert segment_a == 8 + 2  # [CLS] query(8) [SEP]
    assert batch["input_ids"].shape[1] == 32
