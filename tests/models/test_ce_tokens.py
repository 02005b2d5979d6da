"""The documents' cross-encoder token ids (models/ce_tokens.py) come from a first cut of max_length x
FIRST_CHARS_PER_TOKEN characters where that is provably the same (max_length tokens, then whitespace before the
cut), else from the text as before: the ids are always what the tokenizer gives the text cut at clip_all's bound.
A repeated query is tokenized once. The packaged tokenizer, real texts and texts built to fool the first cut."""
from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from sieve.models import ce_tokens
from sieve.models.clip import clip_all
from sieve.models.weights import default_model_path

from .test_clip_before_tokenizing import Recorder

ENGLISH = ("Volcanic eruptions happen when magma rises through the crust, and the pressure of dissolved gases "
           "drives it out of the vent; ash columns can reach the stratosphere. ")


class Counting(Recorder):
    """The real tokenizer, noting how many texts each call hands it."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.calls = []

    def __call__(self, texts, *args, **kwargs):
        self.calls.append(len(texts))
        return super().__call__(texts, *args, **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(default_model_path()))


def texts_that_fool_a_cut(length: int) -> list[str]:
    """Documents around and past the first cut: plain prose, words split by the cut, no whitespace at all, runs of
    whitespace, long words that become many pieces, punctuation and CJK (a token per character), accents."""
    rng = random.Random(7)
    cut = length * ce_tokens.FIRST_CHARS_PER_TOKEN
    words = ["a", "of", "magma", "stratovolcano", "pyroclastic", "Eyjafjallajökull", "x" * 40, "3.14159", "(ash)",
             "火山", "über", "naïve", "--", "pneumonoultramicroscopicsilicovolcanoconiosis"]
    docs = [ENGLISH * n for n in (1, 4, 5, 6, 30)]
    docs += [ENGLISH * 10 + "y" * 5000, "z" * (cut + 10), " " * (cut + 10) + ENGLISH, "火山" * cut]
    docs += [ENGLISH[:k] * 40 for k in (7, 13, 29)]  # the cut lands in every position of a word
    for _ in range(40):
        n = rng.randrange(cut // 8, cut)
        docs.append((" " * rng.choice([1, 1, 1, 3, 40])).join(rng.choice(words) for _ in range(n)))
    return docs


@pytest.mark.parametrize("length", [16, 128])
def test_document_ids_are_those_of_the_text_as_before(tokenizer, length):
    docs = texts_that_fool_a_cut(length)
    before = tokenizer(clip_all(docs, length), add_special_tokens=False, truncation=True,
                       max_length=length)["input_ids"]
    counting = Counting(tokenizer)
    assert ce_tokens.document_ids(counting, docs, length) == before
    assert len(counting.calls) == 3  # every text; the long ones cut; the ones whose cut proved nothing, again
    assert 0 < counting.calls[2] < counting.calls[1]
    assert ce_tokens.document_ids(tokenizer, [], length) == []


def test_prose_is_read_only_to_the_first_cut(tokenizer):
    recorder = Recorder(tokenizer)
    long = [ENGLISH * 30, ENGLISH * 40]
    ids = ce_tokens.document_ids(recorder, long, 128)
    assert recorder.longest == 128 * ce_tokens.FIRST_CHARS_PER_TOKEN < len(long[0])
    assert all(len(row) == 128 for row in ids)


def test_a_repeated_query_is_tokenized_once(tokenizer):
    counting = Counting(tokenizer)
    queries = ["how do volcanoes erupt"] * 100 + ["what is magma"]
    ids = ce_tokens.query_ids(counting, queries, 64)
    assert counting.calls == [2]
    assert ids == tokenizer(queries, add_special_tokens=False, truncation=True, max_length=64)["input_ids"]
