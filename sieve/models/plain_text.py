"""Plain ASCII text tokenized without the BERT normaliser's Unicode work, to the same ids.

A BERT tokenizer (BertNormalizer, then BertPreTokenizer, then WordPiece) normalises every character of a text before
it splits it: it removes control characters and turns whitespace into spaces (`clean_text`), spaces out CJK
characters, decomposes (NFD) and strips accents, and lowercases. On a text that is ASCII with no control character
but tab, newline and carriage return, all of that is lowercasing: no accent, no CJK character, nothing to remove,
and the whitespace it would turn into spaces is whitespace the pre-tokenizer splits at all the same (offsets map
one character to one). A copy of the tokenizer whose normaliser only lowercases (`twin`) then gives the very ids and
offsets of the original at about 0.7x its CPU (SciFact abstracts cut to 768 characters, on an AMD EPYC Zen 4 host:
20.3 against 29.3 ms for 100; the same ids for all 4,392 ASCII abstracts of the 5,183). Any other text, and any
tokenizer that is not built this way, goes through the original (tests/models/test_plain_text.py).

The cross-encoder's per-document ids (models/ce_tokens.py) use it: a /rerank of caller texts tokenizes each of them;
so does the bi-encoder's `tokenize` (models/text_encoder.py: documents at index build and in a /rerank with CMC).
"""
from __future__ import annotations

import json
import re
from typing import Sequence

_NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x7e]")  # anything but printable ASCII, tab, newline and carriage return


def is_plain(text: str) -> bool:
    return _NOT_PLAIN.search(text) is None


def twin(backend):
    """A copy of a tokenizers.Tokenizer whose BertNormalizer is replaced by lowercasing alone (by nothing when it
    does not lowercase), with the backend's own truncation and no padding; None when the tokenizer is not
    BertNormalizer + BertPreTokenizer."""
    from tokenizers import Tokenizer

    config = json.loads(backend.to_str())
    normalizer, pre_tokenizer = config.get("normalizer") or {}, config.get("pre_tokenizer") or {}
    if normalizer.get("type") != "BertNormalizer" or pre_tokenizer.get("type") != "BertPreTokenizer":
        return None
    config["normalizer"] = {"type": "Lowercase"} if normalizer.get("lowercase", True) else None
    config["padding"] = None
    return Tokenizer.from_str(json.dumps(config))


class PlainFirst:
    """`encode_batch` of a tokenizers.Tokenizer (one nothing reconfigures: it is only read, by many threads at
    once): the same encodings in the same order, the plain texts through the tokenizer's twin."""

    def __init__(self, backend):
        self.backend, self.fast = backend, twin(backend)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list:
        texts = list(texts)
        plain = [is_plain(text) for text in texts] if self.fast is not None else [False] * len(texts)
        if not any(plain):
            return self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        if all(plain):
            return self.fast.encode_batch(texts, add_special_tokens=add_special_tokens)
        out: list = [None] * len(texts)
        for use, chosen in ((self.fast, True), (self.backend, False)):
            at = [i for i, p in enumerate(plain) if p is chosen]
            for i, encoding in zip(at, use.encode_batch([texts[i] for i in at], add_special_tokens=add_special_tokens)):
                out[i] = encoding
        return out
