"""Issue 34 items 0 and 8: the /rerank work cap counts the tokens a model really reads, so the most common call
("rerank my top 100", passages of 300-500 characters) fits the default cap while a huge request is still refused
before any work; and no step between two deadline checks reads more than one step's tokens."""
from __future__ import annotations

import numpy as np
import pytest

from transformers import AutoTokenizer

from sieve import checkpoints
from sieve.models.text_encoder import EncoderLengths
from sieve.pipeline.errors import TooMuchWork
from sieve.pipeline.rerank_inputs import DEADLINE_STEP_TOKENS, check_work, encode_within, token_lengths
from sieve.service.config import Settings
from sieve.stages.ce import query_cost
from tests.conftest import ordinary_passages
from tests.fakes import packaged_tokenizer


def test_a_hundred_ordinary_passages_fit_the_default_cap_for_both_rerankers():
    cap, tokenizer, passages = Settings(_env_file=None).rerank_max_tokens, packaged_tokenizer(), ordinary_passages()
    check_work(passages, 256, cap, tokenizer)  # CMC: the candidate tower reads each text (up to 256 tokens)
    query = "how do volcanoes erupt and what happens to the lava"
    ce_tokenizer = AutoTokenizer.from_pretrained(str(checkpoints.shipped(checkpoints.CROSS_ENCODER)))
    check_work(passages, 512, cap, ce_tokenizer, query_cost(ce_tokenizer, query, 64))  # the CE reads each pair
    assert sum(token_lengths(tokenizer, passages, 256)) < cap < sum(min(len(p) + 2, 256) for p in passages)


def test_past_the_cap_is_refused_counting_no_more_than_it_must():
    tokenizer = packaged_tokenizer()
    calls = []

    def counting(texts, **kw):
        calls.append(len(texts))
        return tokenizer(texts, **kw)

    with pytest.raises(TooMuchWork) as refused:
        check_work(["lorem ipsum dolor sit amet " * 185] * 1000, 256, 16_384, counting)
    assert refused.value.field == "documents" and "at least" in refused.value.message
    assert sum(calls) <= 128  # stopped at the first chunk past the cap, not 1,000 texts tokenized
    check_work(["short"] * 10, 256, 16_384, counting)  # under the character bound: nothing tokenized
    assert sum(calls) <= 128


class RecordingTower:
    """The served bi-encoder's tokenizer and lengths (256 document tokens); records the tokens of each forward pass
    instead of running one."""

    def __init__(self):
        self.tokenizer, self.lengths, self.dim, self.batch_size = packaged_tokenizer(), EncoderLengths(64, 256), 4, 32
        self.passes: list[int] = []

    def encode_documents(self, texts, progress=False):
        self.passes.append(sum(token_lengths(self.tokenizer, texts, self.lengths.doc_max_length)))
        return np.zeros((len(texts), self.dim), dtype=np.float32)


def test_no_step_between_deadline_checks_reads_more_than_one_step_of_tokens():
    tower = RecordingTower()
    long_texts = ["knead the dough and bake the bread " * 40] * 64  # each cut at the tower's length
    assert encode_within(tower, long_texts, None) is not None
    assert max(tower.passes) <= DEADLINE_STEP_TOKENS <= 1024 and len(tower.passes) > 1
    assert Settings(_env_file=None).ce_batch_tokens <= 2048  # the cross-encoder's step: one forward pass


@pytest.mark.parametrize("max_length", [16, 128, 512])
def test_counted_lengths_are_what_the_tokenizer_keeps(max_length):
    """Counted on the tokenizer's unlocked copy (plain ASCII texts through its twin, models/plain_text.py): each
    length is that of the tokenizer's own truncating call, special tokens included."""
    tokenizer = packaged_tokenizer()
    texts = [*ordinary_passages(30), "caf\u00e9 na\u00efve \u00fcber " * 40, "\u706b\u5c71" * 300, "", "a\x07b " * 90,
             "Short.", "x" * 5000, "UPPER case\twith\ttabs\nand lines " * 60]
    want = [len(row) for row in tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)
            ["input_ids"]]
    assert token_lengths(tokenizer, texts, max_length) == want
    assert max(want) == max_length and min(want) == 2
