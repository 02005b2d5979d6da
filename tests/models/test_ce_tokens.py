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

ENGLISH = ("Volcanic eruptions happen when magma rises through the crust, and the pressure of dissolved gases "
           "drives it out of the vent; ash columns can reach the stratosphere. ")


class Counting:
    """The private backend copy ce_tokens tokenizes with (ce_tokens.unlocked), noting each call's texts."""

    def __init__(self, backend):
        self.backend, self.calls, self.longest = backend, [], 0

    def encode_batch(self, texts, *args, **kwargs):
        self.calls.append(len(texts))
        self.longest = max([self.longest, *map(len, texts)])
        return self.backend.encode_batch(texts, *args, **kwargs)


@pytest.fixture
def counting(monkeypatch):
    """ce_tokens' calls to its tokenizer backend, counted."""
    recorders = {}
    real = ce_tokens.unlocked

    def recording(tokenizer):
        backend = real(tokenizer)
        return recorders.setdefault(id(backend), Counting(backend))

    monkeypatch.setattr(ce_tokens, "unlocked", recording)
    return lambda tokenizer: recording(tokenizer)


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
def test_document_ids_are_those_of_the_text_as_before(tokenizer, counting, length):
    docs = texts_that_fool_a_cut(length)
    before = tokenizer(clip_all(docs, length), add_special_tokens=False, truncation=True,
                       max_length=length)["input_ids"]
    assert ce_tokens.document_ids(tokenizer, docs, length) == before
    calls = counting(tokenizer).calls
    assert len(calls) == 2  # every text, the long ones cut; the ones whose cut proved nothing, again
    assert calls[0] == len(docs) and 0 < calls[1] < calls[0]
    assert ce_tokens.document_ids(tokenizer, [], length) == []


def test_prose_is_read_only_to_the_first_cut(tokenizer, counting):
    long = [ENGLISH * 30, ENGLISH * 40]
    ids = ce_tokens.document_ids(tokenizer, long, 128)
    assert counting(tokenizer).longest == 128 * ce_tokens.FIRST_CHARS_PER_TOKEN < len(long[0])
    assert counting(tokenizer).calls == [2]
    assert all(len(row) == 128 for row in ids)


def test_each_document_is_read_to_its_own_length(tokenizer, counting):
    """Per-document lengths (a pair's room after its query): each row is the text's first ids at its own length, 0
    gives no ids, and prose is read only to its own first cut."""
    docs = texts_that_fool_a_cut(128)[:20] + [ENGLISH * 30]
    lengths = [(0, 1, 16, 100, 128)[i % 5] for i in range(len(docs) - 1)] + [100]
    expected = [tokenizer(clip_all([d], max(n, 1)), add_special_tokens=False, truncation=True,
                          max_length=max(n, 1))["input_ids"][0][:n] for d, n in zip(docs, lengths)]
    assert ce_tokens.document_ids(tokenizer, docs, lengths) == expected
    assert ce_tokens.document_ids(tokenizer, docs, lengths)[0] == [] and lengths[0] == 0
    calls = counting(tokenizer)
    calls.calls.clear()
    calls.longest = 0
    assert len(ce_tokens.document_ids(tokenizer, [ENGLISH * 30], [100])[0]) == 100
    assert calls.longest == 100 * ce_tokens.FIRST_CHARS_PER_TOKEN and calls.calls == [1]


def test_a_repeated_query_is_tokenized_once(tokenizer, counting):
    queries = ["how do volcanoes erupt"] * 100 + ["what is magma"]
    ids = ce_tokens.query_ids(tokenizer, queries, 64)
    assert counting(tokenizer).calls == [2]
    assert ids == tokenizer(queries, add_special_tokens=False, truncation=True, max_length=64)["input_ids"]


def test_threads_tokenize_at_once_beside_a_tokenizer_reconfigured_between_calls(tokenizer):
    """The backend copy is never reconfigured, so many threads use it at once (no lock, no "Already borrowed")
    while the shared tokenizer is called with other truncation settings in between, and every thread gets the
    ids the text path gives."""
    from concurrent.futures import ThreadPoolExecutor

    from sieve.pipeline.threadsafe import LockedTokenizer

    locked = LockedTokenizer(tokenizer)  # as serving wraps it
    docs = texts_that_fool_a_cut(32)
    expected = {n: tokenizer(clip_all(docs, n), add_special_tokens=False, truncation=True, max_length=n)["input_ids"]
                for n in (16, 32)}

    def one(i: int):
        n = (16, 32)[i % 2]
        if i % 3 == 0:  # the shared backend reconfigured (truncation, padding) while others read the copy
            locked(docs[:4], truncation=True, max_length=8 + i % 5, padding="max_length")
        return n, ce_tokens.document_ids(locked, docs, n)

    with ThreadPoolExecutor(8) as pool:
        for n, ids in pool.map(one, range(48)):
            assert ids == expected[n]
    assert ce_tokens.unlocked(locked) is ce_tokens.unlocked(tokenizer)  # one copy per backend
    copy = ce_tokens.unlocked(tokenizer)  # the backend's copy and its plain-text twin (models/plain_text.py)
    assert copy.fast is not None
    assert all(t.truncation is None and t.padding is None for t in (copy.backend, copy.fast))
