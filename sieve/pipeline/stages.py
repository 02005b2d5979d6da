"""The stage contract and the three stages of the default pipeline.

A stage takes the QueryState whose candidates the previous stage ranked and returns it re-ranked; it never
reaches for HTTP, settings or globals. Candidate lists are validated at every boundary.

A stage may also declare (pipeline/runner.py reads these, so deadlines and batching work for any stage):
- `skippable = True`: when it cannot finish within its time budget, the request goes on with the previous
  stage's order and says so (`partial`, `skipped`). Stages that produce the candidates are not skippable.
- a batched entry point, `batch_key` (str) plus `prepare(state) -> item`, `compute(items) -> results`,
  `finish(state, result) -> state`. `compute` does the model work for items of many requests in one go and must
  use only the stage's model, never per-request attributes: stages with the same batch_key share one batcher
  whose compute is the first instance's. A result of None means the item ran out of time inside compute.
  `__call__` is then `finish(state, compute([prepare(state)])[0])`, the unbatched path. Optionally
  `compute_each(items)` yields (item index, result) as each item finishes; the batcher then answers each request
  as soon as its own rows are scored (pipeline/batching.py).
"""
from __future__ import annotations

import weakref
from typing import Any, Iterator, Protocol, Sequence

import numpy as np
import torch

from sieve.models import ce_tokens
from sieve.models.buckets import bucket_cmc
from sieve.models.cmc_checkpoint import CMCBundle
from sieve.models.device import own_stream, run_graphed
from sieve.models.cross_encoder import CrossEncoder
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.dense_batch import search_dense
from sieve.pipeline.evidence import be_of, bm25_of, features
from sieve.pipeline.batching import in_order
from sieve.pipeline.packing import (IndexRows, chunks_in_order, chunks_under_budget, expired, pad_candidates, pad_lists,
                                    trim_to_longest)
from sieve.pipeline.state import QueryState


class Stage(Protocol):
    name: str

    def __call__(self, state: QueryState) -> QueryState: ...


class BatchedStage(Stage, Protocol):
    batch_key: str
    skippable: bool

    def prepare(self, state: QueryState) -> Any: ...

    def compute(self, items: Sequence[Any]) -> list[Any]: ...

    def finish(self, state: QueryState, result: Any) -> QueryState: ...


class FirstStage:
    """A stage that produces the candidates (the top k of the index); never skipped for lack of time."""

    name = "retrieve"
    skippable = False

    def __init__(self, index, k: int):
        self.index = index
        self.k = k


class Retrieve(FirstStage):
    """Maximum inner-product search of the bi-encoder query vector over the index; `dense`: batched across
    requests (pipeline/dense_batch.py), None: the index's own search, alone."""

    def __init__(self, index, k: int, dense=None):
        super().__init__(index, k)
        self.dense = dense

    def dense_want(self):
        """The vector search this stage will make, for the query encoder's runner to make with the encoding
        (pipeline/dense_batch.py)."""
        return None if self.dense is None else self.dense.want(self.index, self.k)

    def __call__(self, state: QueryState) -> QueryState:
        query = state.query_vectors["be"].float().cpu().numpy()  # (d,)
        with state.timed("mips"):
            scores, rows = search_dense(self.dense, self.index, query, self.k, state)
        # the search's scores are the inner products CMC's evidence reads (`be`): exact on the CPU and through
        # FAISS, fp16's on a CUDA device's flat search (index/device_flat.py), as the ranking itself is there
        state.candidates = Candidates(rows=rows, scores={"retrieve": scores.astype(np.float32)},
                                      inner_products="retrieve")
        state.counts[self.name] = len(state.candidates)
        return state


_READS_VECTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # CMC module -> reads_candidates()


def reads_vectors(model) -> bool:
    """Whether a CMC module reads its candidates' vectors (models/cmc.py reads_candidates; True for a module that
    does not say), asked once per module: stages are built per request, and the answer reads a weight, which on CUDA
    would wait for the device every time. A swapped-in model is a new module, asked afresh."""
    try:
        return _READS_VECTORS[model]
    except KeyError:
        answer = _READS_VECTORS[model] = bool(getattr(model, "reads_candidates", lambda: True)())
        return answer


class CMCRerank:
    """Scores every candidate in the context of all the others and sorts them by that score. Batched across
    queries with padding masks, at most `batch_candidates` (queries x longest list) per forward pass."""

    name = "cmc"
    skippable = True

    def __init__(self, bundle: CMCBundle, index, batch_candidates: int = 16384):
        self.bundle = bundle
        self.index = index
        self.batch_candidates = batch_candidates
        self.batch_key = f"cmc:{id(bundle.model)}"
        # an MLP over the first-stage evidence (the shipped cmc-fusion-mlp) reads no vectors: none are gathered,
        # padded or moved to the device for it (models/cmc.py reads_candidates)
        self.reads_vectors = reads_vectors(bundle.model)

    def candidate_vectors(self, candidates: Candidates, later: bool = False) -> np.ndarray | IndexRows:
        """(K, d): carried with the candidates, else read from the index; with `later`, rows of a local index are
        left for the runner to gather straight into its batch (packing.IndexRows)."""
        store = "cmc" if self.bundle.config.mode == "separate" else None
        if candidates.vectors is not None and candidates.vector_store == store:  # carried with the candidates
            return candidates.vectors
        if later and hasattr(self.index, "embeddings_into") and (candidates.rows >= 0).all():
            return IndexRows(self.index, candidates.rows, store)
        return self.index.embeddings(candidates.rows, store=store)  # (K, d)

    def prepare(self, state: QueryState) -> tuple:
        state.counts[self.name] = len(state.candidates)
        cands, query, vectors = state.candidates, state.query_vectors["cmc"], None
        # the inner products a column already holds are those be_of would compute where CMC shares the bi-encoder's
        # query vector and its vectors: read there, no vector gathered (the `be` retriever over 16,384 candidates)
        shared = self.bundle.config.mode != "separate" and state.query_vectors.get("be") is query
        inner = cands.inner_products if shared and cands.inner_products in cands.scores else None
        needs_vectors = bool(self.bundle.config.evidence) and "be" not in cands.scores and inner is None  # be_of reads them
        if self.reads_vectors or needs_vectors:
            vectors = self.candidate_vectors(cands, later=not needs_vectors)
        evidence = None
        if self.bundle.config.evidence:  # a CMC that fuses first-stage evidence (pipeline/evidence.py)
            evidence = features(be_of(cands, vectors, query, inner), bm25_of(cands, self.index, state.query),
                                self.bundle.config.evidence)
        if not self.reads_vectors:
            query = vectors = None
        return query, vectors, state.deadline, evidence

    def compute(self, items: Sequence[tuple]) -> list[np.ndarray | None]:
        return in_order(self.compute_each(items), len(items))

    # reply-as-done (pipeline/batching.py): yields each item when its chunk is scored, smallest chunks first
    def compute_each(self, items: Sequence[tuple]) -> Iterator[tuple[int, np.ndarray | None]]:
        device = self.bundle.query_tower.device
        counts = [len(item[1]) if item[1] is not None else len(item[3]) for item in items]  # K of each
        for chunk in reversed(chunks_under_budget(counts, self.batch_candidates)):
            live = [i for i in chunk if not expired(items[i][2])]
            yield from ((i, None) for i in chunk if i not in live)
            if not live:
                continue
            query = cands = evidence = None
            if self.reads_vectors:
                query, cands, mask = pad_candidates([items[i][0] for i in live], [items[i][1] for i in live], device)
            if self.bundle.config.evidence:
                evidence, mask = pad_lists([items[i][3] for i in live], device)
            scores = self.forward(query, cands, mask, evidence)  # (B, K)
            yield from ((i, scores[b, :counts[i]]) for b, i in enumerate(live))

    def forward(self, query, cands, mask, evidence) -> np.ndarray:
        """CMC's scores (B, K); at the bucketed shape on the model's own stream where the runtime says so."""
        runtime, (B, K) = self.bundle.runtime, mask.shape
        with torch.inference_mode(), own_stream(mask.device, runtime.streams):
            if runtime.buckets:
                query, cands, mask, evidence = bucket_cmc(query, cands, mask, evidence)
            scores = run_graphed(self.bundle.model, runtime.graphs, query, cands, mask, evidence)
            return scores[:B, :K].float().cpu().numpy()

    def finish(self, state: QueryState, scores: np.ndarray) -> QueryState:
        if not getattr(self.index, "returns_vectors", True) and (state.candidates.rows >= 0).all():
            state.candidates.vectors = None  # read from the local index: a later stage reads it there, no copy below
        state.candidates = state.candidates.rerank_head("cmc", scores)
        state.candidates.validate()
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed("cmc"):
            return self.finish(state, self.compute([self.prepare(state)])[0])


class CrossEncoderRerank:
    """Jointly encodes (query, document) for the first `k` candidates; the rest keep their order below them.
    Batched across requests: all pairs are length-sorted and packed into forward passes of at most
    `batch_tokens` (pairs x longest pair) tokens. On an index holding this cross-encoder's document token ids
    (models/ce_tokens.py) the documents are read as ids (a /search's candidates, a /rerank's indexed documents),
    and only the queries and any other texts are tokenized."""

    name = "ce"
    skippable = True

    def __init__(self, cross_encoder: CrossEncoder, index, k: int, batch_tokens: int = 8192):
        self.cross_encoder = cross_encoder
        self.index = index
        self.k = k
        self.batch_tokens = batch_tokens
        self.batch_key = f"ce:{id(cross_encoder)}"
        self.by_ids = ce_tokens.supports(cross_encoder)
        self.stored = index is not None and ce_tokens.stored_for(cross_encoder, index)

    def documents(self, candidates: Candidates, n: int) -> list[str | list[int]]:
        """The first n candidates' texts, each one's stored token ids instead where the index holds them (a row >= 0
        that comes with a text has the indexed text: pipeline/rerank_inputs.py indexed_rows)."""
        rows = candidates.rows[:n]
        known = np.flatnonzero(rows >= 0) if self.stored else np.empty(0, dtype=np.int64)
        if len(known) == n:
            return ce_tokens.unpack(self.index.embeddings(rows, store=ce_tokens.STORE))
        texts = (list(candidates.texts[:n]) if candidates.texts is not None
                 else [doc.full_text for doc in self.index.documents(rows)])
        if len(known):
            for i, ids in zip(known, ce_tokens.unpack(self.index.embeddings(rows[known], store=ce_tokens.STORE))):
                texts[i] = ids
        return texts

    def prepare(self, state: QueryState) -> tuple:
        n = min(self.k, len(state.candidates))
        state.counts[self.name] = n
        return state.query, self.documents(state.candidates, n), state.deadline

    def compute(self, items: Sequence[tuple]) -> list[np.ndarray | None]:
        return in_order(self.compute_each(items), len(items))

    # reply-as-done (pipeline/batching.py): requests in order of their tokens (shortest first), each request's
    # pairs longest first, packed under batch_tokens; a request is yielded as soon as its last pair is scored
    def compute_each(self, items: Sequence[tuple]) -> Iterator[tuple[int, np.ndarray | None]]:
        yield from ((i, np.empty(0, dtype=np.float32)) for i, (_, docs, _) in enumerate(items) if len(docs) == 0)
        owner = [i for i, (_, docs, _) in enumerate(items) for _ in range(len(docs))]  # item of each pair
        if not owner:
            return
        ce = self.cross_encoder
        assert ce.tokenizer.padding_side == "right", "trim_to_longest cuts padding columns on the right"
        batch = self.pair_batch(items)
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        tokens = np.bincount(owner, weights=lengths, minlength=len(items))  # per item
        order = sorted(range(len(owner)), key=lambda p: (tokens[owner[p]], owner[p], -lengths[p]))
        starts = np.cumsum([0] + [len(docs) for _, docs, _ in items])
        left = [len(docs) for _, docs, _ in items]
        scores = np.full(len(owner), np.nan, dtype=np.float32)
        for chunk in chunks_in_order(lengths, order, self.batch_tokens):
            live = [p for p in chunk if not expired(items[owner[p]][2])]
            if live:
                with torch.inference_mode():
                    scores[live] = ce.scorer(**trim_to_longest(batch, live)).float().cpu().numpy()
            for p in chunk:
                i = owner[p]
                left[i] -= 1
                if left[i] == 0:
                    part = scores[starts[i]:starts[i + 1]]
                    yield i, (None if np.isnan(part).any() else part)

    def pair_batch(self, items: Sequence[tuple]) -> dict[str, torch.Tensor]:
        """Every pair of the items, padded, in item order. For a head that lays out its pairs from token ids: every
        text of the batch tokenized in one call, each distinct query once, stored ids as they are; else the text
        pairs tokenized as before. Either way the same tensors (tests/pipeline/test_ce_token_store.py)."""
        ce = self.cross_encoder
        if not self.by_ids:
            return ce.tokenize_pairs([q for q, docs, _ in items for _ in docs], [t for _, docs, _ in items for t in docs])
        docs = [d for _, item_docs, _ in items for d in item_docs]
        queries = ce_tokens.query_ids(ce.tokenizer, [q for q, item_docs, _ in items for _ in item_docs],
                                      ce.lengths.query_max_length)
        texts = [i for i, d in enumerate(docs) if isinstance(d, str)]
        room = ce.document_room([queries[i] for i in texts])  # each text tokenized only as far as its pair reads
        for i, ids in zip(texts, ce_tokens.document_ids(ce.tokenizer, [docs[i] for i in texts], room)):
            docs[i] = ids
        return ce.pairs_from_ids(queries, docs)

    def finish(self, state: QueryState, scores: np.ndarray) -> QueryState:
        state.candidates = state.candidates.rerank_head(self.name, scores)  # "ce", or a subclass's own name
        state.candidates.validate()
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed(self.name):
            return self.finish(state, self.compute([self.prepare(state)])[0])
