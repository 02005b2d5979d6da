"""Each document's cross-encoder token ids, kept in the index as the store "ce_tokens", so that a /search with the
cross-encoder, and a /rerank of indexed documents, tokenizes only its query and lays the pairs out from stored ids
(the documents' texts are neither read from SQLite nor tokenized per request).

For the heads that lay out their own pairs from token ids (`pair_inputs`: "gated", the shipped head), the ids a pair
is built from are the document's first `max_length` tokens without special tokens, whatever the query: stored once
they give the very tensors the text path gives (tests/pipeline/test_ce_token_store.py). A head that tokenizes the
(query, document) text pair itself ("cls", or one that marks its texts) has no such ids: it keeps the text path.

A store is a (rows, dim) float32 array (index/segments.py), so a row is the ids as float32 (exact below 2**24),
padded with -1; it is written with the index's dtype, hence only on float32 indexes. Its identity (the manifest's
`stores.ce_tokens`) is the tokenizer's content and max_length: a server whose cross-encoder tokenizes differently
does not read it and tokenizes the texts as before.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from sieve.models.clip import clip_all, clip_chars

STORE = "ce_tokens"
FIRST_CHARS_PER_TOKEN = 6  # document_ids' first cut
PAD = -1
EXACT_BELOW = 2 ** 24  # float32 holds every integer below this


def supports(ce) -> bool:
    """Whether a (local) cross-encoder's pairs can be laid out from stored document ids."""
    scorer = getattr(ce, "scorer", None)
    tokenizer = getattr(ce, "tokenizer", None)
    return (scorer is not None and hasattr(scorer, "pair_inputs") and not hasattr(scorer, "mark_texts")
            and getattr(tokenizer, "backend_tokenizer", None) is not None)


def document_ids(tokenizer, documents: Sequence[str], max_length: int | Sequence[int]) -> list[list[int]]:
    """Each document's first max_length token ids, no special tokens: what a pair_inputs head reads. `max_length`:
    one length for all, or each document's own (a pair's room for its document after its query: GatedScorer.doc_budget;
    0 gives [] untokenized).

    The tokenizer reads a whole text to keep its first tokens, so a document is first cut at max_length x
    FIRST_CHARS_PER_TOKEN characters (English runs 4-5 per token). Its ids from that cut are the whole text's when
    the cut left max_length tokens and whitespace between the last of them and the cut: the word the cut split
    comes after every kept token, and tokenizers split words at whitespace. Any other document longer than the cut
    is tokenized again as before (clip_all's bound). Same ids, less text read: building the pairs of a /rerank of
    100 SciFact abstracts read ~1,500 characters each for 128 tokens. Tokenized by `unlocked(tokenizer)`: callers
    in many threads at once run in parallel."""
    if not documents:
        return []
    lengths = [max_length] * len(documents) if isinstance(max_length, int) else [max(0, n) for n in max_length]
    backend = unlocked(tokenizer)
    cut = [d[:n * FIRST_CHARS_PER_TOKEN] for d, n in zip(documents, lengths)]
    ids, again = [], []
    for i, (document, text, n, encoding) in enumerate(zip(documents, cut, lengths,
                                                         backend.encode_batch(cut, add_special_tokens=False))):
        row = encoding.ids[:n]
        ids.append(row)
        if n and len(document) > len(text) and not (len(row) == n and _space_after(text, encoding.offsets[n - 1][1])):
            again.append(i)
    if again:
        texts = [clip_chars(documents[i], lengths[i]) for i in again]
        for i, encoding in zip(again, backend.encode_batch(texts, add_special_tokens=False)):
            ids[i] = encoding.ids[:lengths[i]]
    return ids


def _space_after(text: str, end: int) -> bool:
    return any(c.isspace() for c in text[end:])


def query_ids(tokenizer, queries: Sequence[str], query_max_length: int) -> list[list[int]]:
    """Each query's first query_max_length token ids; a query repeated (one per document of a /rerank) is tokenized
    once, and its rows share one list."""
    unique = list(dict.fromkeys(queries))
    encodings = unlocked(tokenizer).encode_batch(clip_all(unique, query_max_length), add_special_tokens=False)
    ids = {q: encoding.ids[:query_max_length] for q, encoding in zip(unique, encodings)}
    return [ids[q] for q in queries]


def unlocked(tokenizer):
    """A private copy of a fast tokenizer's backend that nothing reconfigures: no truncation, no padding, ever
    (text_encoder.private_copy). The transformers wrapper sets the shared backend's truncation on a call whose
    settings differ from the last, which is why serving locks each tokenizer (pipeline/threadsafe.py) and tokenizes one
    call at a time; this copy is only read, so threads call it at once without a lock (ids are cut to length by the
    caller: the first n ids, as truncation keeps them). Plain ASCII texts skip the normaliser's Unicode work there
    (models/plain_text.py: the same ids at about 0.7x the CPU)."""
    from sieve.models.text_encoder import private_copy

    return private_copy(tokenizer)


def pack(ids: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """(N, width) float32 rows of ids, padded with PAD."""
    out = np.full((len(ids), width), PAD, dtype=np.float32)  # (N, width)
    for i, row in enumerate(ids):
        if len(row) > width or (len(row) and max(row) >= EXACT_BELOW):
            raise ValueError(f"{len(row)} ids (largest {max(row)}) do not fit a row of {width} float32 ids")
        out[i, :len(row)] = row
    return out


def unpack(rows: np.ndarray) -> list[list[int]]:
    """(N, width) stored rows -> each document's ids."""
    return [row[row >= 0].astype(np.int64).tolist() for row in np.asarray(rows)]


def identity(ce) -> dict[str, object]:
    """What the manifest records about a ce_tokens store, as index/encoder.py's encoder_identity writes it; computed
    once per cross-encoder, tokenizer and max_length (hashing the tokenizer's JSON takes milliseconds)."""
    backend = ce.tokenizer.backend_tokenizer
    key = (ce.name, ce.lengths.max_length, id(backend))
    cached = getattr(ce, "_ce_tokens_identity", None)
    if cached is None or cached[0] != key:
        digest = hashlib.sha256(backend.to_str().encode())
        digest.update(f"|max_length={ce.lengths.max_length}".encode())
        cached = (key, {"model_name": f"ce-tokens:{ce.name}", "model_hash": digest.hexdigest(),
                        "dim": int(ce.lengths.max_length)})
        ce._ce_tokens_identity = cached
    return cached[1]


class CETokenStore:
    """index.DocumentEncoder over a cross-encoder's tokenizer: `sieve index build --ce-tokens`, and new documents'
    rows on every write to an index that holds the store."""

    def __init__(self, ce):
        if not supports(ce):
            raise ValueError(f"{ce.name}: its head tokenizes (query, document) text pairs itself; it has no "
                             "per-document token ids to store")
        self.ce = ce
        ident = identity(ce)
        self.name, self.weights_hash, self.dim = ident["model_name"], ident["model_hash"], ident["dim"]
        self.max_length = self.dim

    def encode_documents(self, texts: Sequence[str], progress: bool = True) -> np.ndarray:
        return pack(document_ids(self.ce.tokenizer, texts, self.max_length), self.dim)


def stored_for(ce, index) -> bool:
    """Whether `index` holds ce_tokens rows this cross-encoder reads as its own."""
    manifest = getattr(index, "manifest", None)
    stores = getattr(manifest, "stores", None) or {}
    return STORE in stores and supports(ce) and stores[STORE] == identity(ce)
