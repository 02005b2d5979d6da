"""Plain ASCII texts (printable characters, tab, newline, carriage return) skip the BERT normaliser's Unicode work
and get the very encodings the tokenizer gives them: ids and offsets, in order, beside texts that still need the
normaliser (accents, CJK, control characters) in the same batch (models/plain_text.py)."""
from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from sieve.models.clip import clip_all
from sieve.models.plain_text import PlainFirst, is_plain, twin
from sieve.models.weights import default_model_path
from tests.conftest import ordinary_passages


@pytest.fixture(scope="module")
def backend():
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    copy = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def random_ascii(rng: random.Random, n: int, controls: bool) -> str:
    """Printable ASCII, tab, newline and carriage return (and with `controls` every other control character and
    DEL too), words of any length, runs of whitespace."""
    pool = [chr(c) for c in (range(128) if controls else [9, 10, 13, *range(32, 127)])]
    pool += list("aeiou stnrl") * 8 + [" "] * 20
    return "".join(rng.choice(pool) for _ in range(n))


def texts() -> list[str]:
    rng = random.Random(3)
    out = ordinary_passages(40)
    out += ["Volcanoes ERUPT when MAGMA rises.\tAsh\ncolumns\r\nreach 30 km (10^4 m); see [1], e.g. p. 3-4!",
            "x" * 250 + " short", "  leading and trailing  ", "", "\t\n\r", "UPPER lower MiXeD 123 $%& @#~`|\\^_{}",
            "caf\u00e9 na\u00efve \u00fcber", "\u706b\u5c71 volcano", "bell\x07 and\x0bvertical\x0cfeed",
            "unit\x1fseparator", "delete\x7fme", "nbsp\u00a0space", "emoji \U0001F30B"]
    out += [random_ascii(rng, rng.randrange(1, 400), controls=i % 2 == 1) for i in range(300)]
    return out


def as_tuples(encodings) -> list:
    return [(e.ids, e.offsets, e.tokens) for e in encodings]


def test_what_counts_as_plain():
    assert is_plain("Plain text, digits 0-9 and punctuation!?\t\n\r")
    assert not any(map(is_plain, ["caf\u00e9", "\x00", "\x0b", "\x1f", "\x7f", "\u00a0", "\u706b"]))


@pytest.mark.parametrize("special", [False, True])
def test_the_same_encodings_as_the_tokenizer(backend, special):
    batch = texts()
    assert sum(map(is_plain, batch)) > 100 and sum(not is_plain(t) for t in batch) > 100  # both kinds, mixed
    got = PlainFirst(backend).encode_batch(batch, add_special_tokens=special)
    assert as_tuples(got) == as_tuples(backend.encode_batch(batch, add_special_tokens=special))


def test_all_plain_and_none_plain_batches(backend):
    fast = PlainFirst(backend)
    plain = [t for t in texts() if is_plain(t)]
    other = [t for t in texts() if not is_plain(t)]
    for batch in (plain, other, []):
        assert as_tuples(fast.encode_batch(batch, add_special_tokens=False)) == \
            as_tuples(backend.encode_batch(batch, add_special_tokens=False))


def test_only_a_bert_normaliser_and_pre_tokenizer_get_a_twin(backend):
    assert twin(backend) is not None
    config = json.loads(backend.to_str())
    config["pre_tokenizer"] = {"type": "Whitespace"}
    other = Tokenizer.from_str(json.dumps(config))
    assert twin(other) is None
    assert as_tuples(PlainFirst(other).encode_batch(["Plain Text"])) == as_tuples(other.encode_batch(["Plain Text"]))
    cased = json.loads(backend.to_str())
    cased["normalizer"]["lowercase"] = False
    cased_tokenizer = Tokenizer.from_str(json.dumps(cased))
    assert json.loads(twin(cased_tokenizer).to_str())["normalizer"] is None
    batch = texts()
    assert as_tuples(PlainFirst(cased_tokenizer).encode_batch(batch)) == as_tuples(cased_tokenizer.encode_batch(batch))


@pytest.mark.parametrize("max_length", [8, 64, 256])
@pytest.mark.parametrize("side", ["right", "left"])
def test_the_bi_encoders_batches_are_the_tokenizers_own(biencoder, max_length, side):
    """TextEncoder.tokenize (documents at build, /rerank texts for CMC, long queries) through its private truncating
    copy: the very tensors the tokenizer's own padded, truncated call gives, on either padding and truncation side."""
    import copy

    import torch

    encoder = copy.copy(biencoder)
    encoder.tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    encoder.tokenizer.padding_side = encoder.tokenizer.truncation_side = side
    batch = [*texts()[::3], "Volcanic ash columns reach the stratosphere. " * 60, "caf\u00e9 " * 400]
    got = encoder.tokenize(batch, max_length)
    # as before: the texts cut by characters first (models/clip.py), then the tokenizer's own call
    want = encoder.tokenizer(clip_all(batch, max_length), padding=True, truncation=True, max_length=max_length,
                             return_tensors="pt")
    for key in ("input_ids", "attention_mask"):
        assert torch.equal(got[key], want[key]), key
    assert got["input_ids"].shape[1] == max_length  # some texts were cut
