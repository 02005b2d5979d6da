"""Every /search counts its query's tokens (the length check) on a private copy of the fast tokenizer's backend, not
through the tokenizer the batch workers share: the counts must be the shared tokenizer's own, whatever settings
that one was last called with, and threads may count at once. The real packaged tokenizer."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sieve.models.clip import clip_chars

TEXTS = ["", " ", "how do volcanoes erupt", "0-dimensional biomaterials show inductive properties.",
         "Héllo wörld, naïve café: 北京 東京 😀 🤖 — ‘quotes’ and \u00a0non-breaking spaces",
         "ALL CAPS AND punctuation!!! ??? ... (parentheses) [brackets] {braces} #hash @at",
         "antidisestablishmentarianism " * 40, "x" * 5000, "tab\tnew\nline\r\n end",
         "a " * 3000]


def reference_count(tokenizer, text: str, at_most: int = 4096) -> int:
    """What count_tokens computed before: the shared tokenizer's own call, no truncation."""
    return len(tokenizer(clip_chars(text, at_most), add_special_tokens=True, truncation=False)["input_ids"])


def test_counts_equal_the_shared_tokenizers(biencoder):
    assert biencoder.counter is not None  # the packaged tokenizer is a fast one: the private path is the one tested
    biencoder.tokenize(["set truncation and padding on the shared one"], 8)  # its last settings must not leak
    for text in TEXTS:
        assert biencoder.count_tokens(text) == reference_count(biencoder.tokenizer, text), text[:40]
    assert biencoder.count_tokens("word " * 100) > biencoder.lengths.query_max_length  # not cut at any limit


def test_counts_from_many_threads_at_once(biencoder):
    texts = [f"{t} {i}" for i in range(50) for t in TEXTS[2:6]]
    expected = [reference_count(biencoder.tokenizer, t) for t in texts]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(biencoder.count_tokens, texts)) == expected


def test_a_tokenizer_without_a_backend_is_counted_by_its_own_call(biencoder):
    from sieve.models.text_encoder import TextEncoder

    class Slow:  # a "slow" (pure Python) tokenizer has no backend_tokenizer
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    encoder = TextEncoder(biencoder.module, Slow(biencoder.tokenizer), name="slow", weights_hash="x")
    assert encoder.counter is None
    assert encoder.count_tokens(TEXTS[4]) == reference_count(biencoder.tokenizer, TEXTS[4])
