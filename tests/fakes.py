"""Tiny random models in the real runtimes (fake only at the model boundary) for fast API tests."""
from __future__ import annotations

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertModel

from sieve.models.biencoder import SentenceEncoder
from sieve.models.cross_encoder import CrossEncoder, PairScorer
from sieve.models.text_encoder import EncoderLengths, TextEncoder
from sieve.models.weights import default_model_path


def tiny_config(tokenizer, **extra) -> BertConfig:
    # hidden 48: divisible by the 2 BERT heads and by CMC's 6 heads
    return BertConfig(vocab_size=len(tokenizer), hidden_size=48, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=96, max_position_embeddings=512, **extra)


def packaged_tokenizer():
    return AutoTokenizer.from_pretrained(str(default_model_path()))


def tiny_biencoder(tokenizer=None, seed: int = 0) -> TextEncoder:
    tokenizer = tokenizer or packaged_tokenizer()
    torch.manual_seed(seed)
    return TextEncoder(SentenceEncoder(BertModel(tiny_config(tokenizer)).eval()), tokenizer, name="tiny-bert",
                       weights_hash=f"tiny-bert-{seed}", lengths=EncoderLengths(64, 128))


def tiny_cross_encoder(tokenizer=None, seed: int = 0) -> CrossEncoder:
    tokenizer = tokenizer or packaged_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(tiny_config(tokenizer, num_labels=1))
    return CrossEncoder(PairScorer(model), tokenizer, name="tiny-ce", weights_hash=f"tiny-ce-{seed}", batch_size=4)
