"""A 7 MB text once cost 7 s of tokenizing before any deadline check, to keep 256 tokens of it: texts are cut by
characters (with a margin of CHARS_PER_TOKEN per token) before the tokenizer sees them, and the vectors and scores
are those of the whole text. The real packaged model and tokenizer; a recorder around the tokenizer only counts
what it is given."""
from __future__ import annotations

import copy

import numpy as np
import torch

from sieve.models.clip import CHARS_PER_TOKEN

HUGE = "the dough rises while the oven heats " * 200_000  # 7.4 MB


class Recorder:
    """The real tokenizer, noting the longest text it is handed."""

    def __init__(self, tokenizer):
        self.tokenizer, self.longest = tokenizer, 0

    def __call__(self, texts, *args, **kwargs):
        for text in [texts] if isinstance(texts, str) else texts:
            self.longest = max(self.longest, len(text))
        return self.tokenizer(texts, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_the_biencoder_tokenizes_a_bounded_prefix_with_the_same_vector(biencoder):
    encoder = copy.copy(biencoder)
    encoder.tokenizer = Recorder(biencoder.tokenizer)
    vector = encoder.encode_documents([HUGE], progress=False)
    assert encoder.tokenizer.longest <= encoder.lengths.doc_max_length * CHARS_PER_TOKEN
    np.testing.assert_allclose(vector, biencoder.encode_documents([HUGE[:20_000]], progress=False), atol=1e-6)
    assert encoder.count_tokens(HUGE) > encoder.lengths.doc_max_length  # still says the text is longer
    assert encoder.tokenizer.longest < 200_000


def test_the_cross_encoder_tokenizes_a_bounded_prefix_with_the_same_score(ce_checkpoint):
    from sieve.models.cross_encoder import CrossEncoder

    ce = CrossEncoder.from_pretrained(ce_checkpoint)
    reference = ce.score("how is bread baked", [HUGE[:40_000]])
    ce.tokenizer = Recorder(ce.tokenizer)
    score = ce.score("how is bread baked", [HUGE])
    assert ce.tokenizer.longest <= ce.lengths.max_length * CHARS_PER_TOKEN
    torch.testing.assert_close(score, reference)
