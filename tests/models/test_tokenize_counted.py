"""TextEncoder.tokenize_counted (the query batcher's one tokenization, models/text_encoder.py) gives exactly the
tensors of `tokenize` and the counts of `count_tokens`: texts of mixed lengths (padding), accents, CJK, emoji,
texts over the limit (the tokenizer's own truncation), and a left-padding tokenizer."""
from __future__ import annotations

import copy

import pytest
import torch

TEXTS = ["how do volcanoes erupt", "Ça coûte 3€ — naïve café résumé", "東京の天気は？ 北京 서울", "🌋 lava 🔥🔥",
         "a", "word " * 40, "Tumour-suppressor p53: mutations & their effects in (human) cancers?!"]


def same(encoder, texts, max_length):
    batch, counts = encoder.tokenize_counted(texts, max_length)
    want = encoder.tokenize(texts, max_length)
    assert set(batch) == {"input_ids", "attention_mask"}
    for key in batch:
        assert batch[key].dtype == want[key].dtype and torch.equal(batch[key], want[key]), key
    assert counts == [encoder.count_tokens(t) for t in texts]
    return counts


@pytest.mark.parametrize("max_length", [64, 16])
def test_the_same_tensors_and_counts_as_tokenize_and_count_tokens(biencoder, max_length):
    counts = same(biencoder, TEXTS, max_length)
    assert max(counts) > 16  # with 16, some texts are over the limit: the tokenizer's own truncation
    for text in TEXTS:
        same(biencoder, [text], max_length)


def test_left_padding(biencoder):
    encoder = copy.copy(biencoder)
    encoder.tokenizer = copy.deepcopy(biencoder.tokenizer)
    encoder.tokenizer.padding_side = "left"
    same(encoder, TEXTS, 64)


def test_the_query_batcher_answers_vectors_and_counts(biencoder):
    out = biencoder.encode_queries_counted(TEXTS[:3])
    vectors = biencoder.encode_queries(TEXTS[:3])
    assert [n for _, n in out] == [biencoder.count_tokens(t) for t in TEXTS[:3]]
    assert torch.allclose(torch.stack([v for v, _ in out]), vectors, atol=1e-6)
