"""Texts cut by characters before they reach a tokenizer. A model reads at most `max_length` tokens of a text, but
the tokenizer reads the whole of it first: a 7 MB document costs seconds of tokenizing for 512 tokens kept, before
any deadline can be checked. No real text holds fewer than one token per CHARS_PER_TOKEN characters (English is
about 4-5, code and CJK fewer), so cutting there leaves the tokens a model keeps unchanged and bounds the tokenizer's
work per text; only pathological texts (runs of whitespace, words of hundreds of letters) can lose tokens."""
from __future__ import annotations

from typing import Sequence

CHARS_PER_TOKEN = 24


def clip_chars(text: str, max_tokens: int) -> str:
    """`text` cut to at most max_tokens x CHARS_PER_TOKEN characters."""
    limit = max_tokens * CHARS_PER_TOKEN
    return text if len(text) <= limit else text[:limit]


def clip_all(texts: Sequence[str], max_tokens: int) -> list[str]:
    return [clip_chars(t, max_tokens) for t in texts]
