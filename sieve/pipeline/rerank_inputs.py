"""/rerank inputs: texts, indexed ids or both, turned into a candidate list with vectors for CMC."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sieve.models import ce_tokens
from sieve.models.clip import clip_all
from sieve.models.cmc_checkpoint import CMCBundle
from sieve.models.text_encoder import TextEncoder
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.errors import TooMuchWork
from sieve.pipeline.state import QueryState, expired


@dataclass(frozen=True)
class RerankItem:
    """One /rerank input: a text, an indexed id, or both."""

    text: str | None = None
    id: str | None = None


def resolve_texts(index, items: Sequence[RerankItem]) -> list[str]:
    """Each item's text: its own, or the indexed document's when only an id was given."""
    id_only = [item.id for item in items if item.text is None]
    stored = {}
    if id_only:
        rows = index.rows_for_ids(id_only)
        stored = {doc.id: doc.full_text for doc in index.documents(rows)}
    return [item.text if item.text is not None else stored[item.id] for item in items]


def indexed_rows(index, items: Sequence[RerankItem], texts: list[str]) -> list[int]:
    """Index row of each item whose id is indexed and whose text (if given) is the indexed text, else -1. An id
    alone was given the indexed text (resolve_texts): only items that brought a text of their own are read back."""
    ids = [item.id for item in items if item.id is not None and index.has_id(item.id)]
    if not ids:
        return [-1] * len(items)
    rows = dict(zip(ids, index.rows_for_ids(ids)))
    given = [rows[item.id] for item in items if item.id in rows and item.text is not None]
    docs = {doc.id: doc.full_text for doc in index.documents(given)} if given else {}
    return [rows[item.id] if item.id in rows and (item.text is None or docs[item.id] == text) else -1
            for item, text in zip(items, texts)]


COUNT_CHUNK = 64  # texts tokenized per call while counting: the count stops at the first chunk past the cap


def check_work(texts: Sequence[str], max_length: int, limit: int | None, tokenizer=None, per_text: int = 0) -> None:
    """413 when the texts a model must read come to more than `limit` tokens, each counted as the model reads it:
    its tokens with the special ones, at most `max_length`, plus `per_text` (a cross-encoder's query and separator,
    read again with every document). First the bound min(characters + 2 + per_text, max_length) (no token holds
    less than one character): under the cap, nothing is tokenized. Past it, the texts are counted by the model's
    own fast tokenizer, a chunk at a time, stopping at the first chunk past the cap; each text is cut to what the
    model can keep first (models/clip.py), so a megabyte text costs no more to count than to read. Without a
    tokenizer (a remote cross-encoder) the bound decides."""
    if limit is None:
        return
    bound = sum(min(len(t) + 2 + per_text, max_length) for t in texts)
    if bound <= limit:
        return
    if tokenizer is None:
        raise too_much_work(f"up to {bound}", limit)
    total = 0
    for start in range(0, len(texts), COUNT_CHUNK):
        total += sum(min(n + per_text, max_length) for n in token_lengths(tokenizer, texts[start:start + COUNT_CHUNK], max_length))
        if total > limit:
            more = " at least" if start + COUNT_CHUNK < len(texts) else ""
            raise too_much_work(f"{more} {total}".strip(), limit)


def token_lengths(tokenizer, texts: Sequence[str], max_length: int) -> list[int]:
    """Tokens of each text with its special tokens, cut at `max_length` (one batch call of the fast tokenizer). A
    fast tokenizer counts on its never-reconfigured copy (models/ce_tokens.py `unlocked`: no lock held, plain ASCII
    texts without the normaliser's Unicode work), whose untruncated length cut at max_length is what truncation
    keeps (the special tokens stay); a slow one through its own call."""
    texts = clip_all(texts, max_length)
    if getattr(tokenizer, "backend_tokenizer", None) is not None:
        return [min(len(e.ids), max_length) for e in ce_tokens.unlocked(tokenizer).encode_batch(texts, add_special_tokens=True)]
    ids = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length,
                    return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    return [len(row) for row in ids]


def too_much_work(tokens: str, limit: int) -> TooMuchWork:
    return TooMuchWork(f"these documents are {tokens} tokens for the model to read; this server takes at most {limit} "
                       "per request", field="documents",
                       allowed=f"at most {limit} tokens (SIEVE_RERANK_MAX_TOKENS): fewer or shorter documents, "
                       "or ids of indexed documents")


# tokens encoded between two deadline checks: the most a request runs past its deadline is one step
# (benchmarks/results/rerank_cap.json measures it); a whole batch of 32 long texts once overran a 10 s deadline by
# 12 s on a loaded host, and 8 texts of 256 tokens by 1.7 s on a 2 s deadline
DEADLINE_STEP_TOKENS = 1024


def steps_under(lengths: Sequence[int], budget: int, most: int) -> list[list[int]]:
    """Consecutive positions grouped so that each group's tokens stay under `budget` (a text longer than the
    budget is a step of its own) and no group holds more than `most`."""
    steps, current, tokens = [], [], 0
    for position, length in enumerate(lengths):
        if current and (tokens + length > budget or len(current) == most):
            steps.append(current)
            current, tokens = [], 0
        current.append(position)
        tokens += length
    return steps + [current] if current else steps


def encode_within(tower: TextEncoder, texts: list[str], deadline: float | None) -> np.ndarray | None:
    """(N, d) vectors, a few texts at a time (longest first, at most DEADLINE_STEP_TOKENS real tokens and
    tower.batch_size texts a step); None when the deadline has passed (or the client has gone) with texts still to
    go. A request is late by at most one step, and one step always runs."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    lengths = token_lengths(tower.tokenizer, [texts[i] for i in order], tower.lengths.doc_max_length)
    out = np.empty((len(texts), tower.dim), dtype=np.float32)
    for n, step in enumerate(steps_under(lengths, DEADLINE_STEP_TOKENS, tower.batch_size)):
        if n and expired(deadline):
            return None
        idx = order[step]
        out[idx] = tower.encode_documents([texts[i] for i in idx], progress=False)
    return out


def rerank_candidates(index, items: Sequence[RerankItem], texts: list[str], bundle: CMCBundle,
                      biencoder: TextEncoder, state: QueryState) -> Candidates | None:
    """Indexed documents reuse their stored vectors; any other text goes through the candidate tower now, within
    the request's deadline (None when it runs out first). The candidates carry a "retrieve" score,
    <query, candidate>: the order kept if CMC runs out of time."""
    indexed = indexed_rows(index, items, texts)
    store = "cmc" if bundle.config.mode == "separate" else None
    tower = bundle.candidate_tower or biencoder
    vectors = np.empty((len(items), tower.dim), dtype=np.float32)
    known = [i for i, row in enumerate(indexed) if row >= 0]
    if known:
        vectors[known] = index.embeddings([indexed[i] for i in known], store=store)
    fresh = [i for i, row in enumerate(indexed) if row < 0]
    if fresh:
        with state.timed("candidate_encode"):
            encoded = encode_within(tower, [texts[i] for i in fresh], state.deadline)
        if encoded is None:
            return None
        vectors[fresh] = encoded
    state.counts["candidate_encode"] = len(fresh)
    query = state.query_vectors["cmc"].float().cpu().numpy()  # (d,)
    retrieve = vectors @ query  # (K,)
    order = np.argsort(-retrieve, kind="stable")
    cands = Candidates(rows=np.asarray(indexed), scores={"retrieve": retrieve.astype(np.float32)}, vectors=vectors,
                       texts=texts, vector_store=store)
    return cands.take(order)
