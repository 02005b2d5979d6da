"""The front object: builds the stage list a request asks for and runs it. No HTTP, no settings object.

Every request reads one index version from start to end (`state.index`), so a live swap of `self.index` never
mixes versions inside a request. Model work goes through per-model runners (pipeline/batching.py): batched
across concurrent requests, or one by one when batching is off; either way a stage can be given up on when its
time budget runs out (pipeline/runner.py).
"""
from __future__ import annotations

import re
import threading
import time
import unicodedata
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from sieve.models.cmc_checkpoint import CMCBundle
from sieve.models.cross_encoder import CrossEncoder
from sieve.models.text_encoder import TextEncoder
from sieve.pipeline import registry
from sieve.pipeline.batching import BatchConfig, Runners
from sieve.pipeline.candidates import Candidates, ranked_scores
from sieve.pipeline.dense_batch import DenseSearch, DenseWant, encode_then_search
from sieve.pipeline.errors import EncoderTimeout, QueryTooLong, RequestError, StageUnavailable
from sieve.pipeline.first_stage import HybridConfig
from sieve.pipeline.remote_ce import RemoteCrossEncoder
from sieve.pipeline.registry import CROSS_ENCODER, RERANKER, RETRIEVER, BuildContext, RerankContext, StageSpec
from sieve.pipeline.rerank_inputs import RerankItem, resolve_texts
from sieve.pipeline.runner import run_stage, wait
from sieve.pipeline.stages import Stage
from sieve.pipeline.state import Deadline, QueryState
from sieve.pipeline.threadsafe import TokenizerLocks

__all__ = ["Searcher", "SearchParams", "RerankItem", "Outcome", "SearchOptions", "normalise_query"]


ENCODE_GRACE_S = 1.0  # the least a request waits for its query vector past its deadline (Searcher.encoded)


@dataclass(frozen=True)
class SearchParams:
    query: str
    top_k: int = 10
    retrieve_k: int = 512
    rerank: str = "cmc"
    cmc_k: int = 16  # candidates CMC passes on, and the number the cross-encoder scores
    cross_encoder: bool = False
    timeout_ms: int | None = None  # whole-request budget; stages that do not fit are skipped
    retriever: str | None = None  # None: "hybrid" when the index has a lexical part, else "be"; "bm25": BM25
    # alone; "anncur": the cross-encoder retrieves (pipeline/anncur_stage.py), no bi-encoder
    ce_model: str = "ce"  # with cross_encoder: "ce" or "ce_late" (pipeline/rerankers.py)
    use_cache: bool = True  # False: compute the query vectors afresh (the service's Cache-Control: no-cache)
    cancelled: threading.Event | None = None  # set when the client hangs up: the work stops as at a deadline


@dataclass
class Outcome:
    candidates: Candidates
    final_stage: str
    state: QueryState
    index_version: int
    documents: list = field(default_factory=list)
    index: object | None = None  # the version that answered: map candidate rows with this one

    @property
    def partial(self) -> bool:
        return self.state.partial


class EmbeddingCache(Protocol):
    def get(self, tower: TextEncoder, query: str) -> torch.Tensor | None: ...

    def put(self, tower: TextEncoder, query: str, vector: torch.Tensor) -> None: ...


def normalise_query(query: str) -> str:
    """NFC and single spaces: what the tokenizers see anyway, so cache keys never split one query in two."""
    return " ".join(unicodedata.normalize("NFC", query).split())


@dataclass(frozen=True)
class SearchOptions:
    """What every stage's build reads besides its model: batch sizes and the hybrid fusion."""

    batching: BatchConfig = BatchConfig()
    hybrid: HybridConfig = HybridConfig()
    stage_budgets_ms: dict = field(default_factory=dict)
    dense: Any = None  # DenseSearch (pipeline/dense_batch.py): a first stage's vector search, batched; None: alone


class Searcher:
    """`models`: the loaded model of each optional stage, by stage name (sieve/pipeline/registry.py); `cmc` and
    `cross_encoder` are shorthands for models["cmc"] and models["ce"]. Stages are planned from the registry."""

    def __init__(self, biencoder: TextEncoder, index, cmc: CMCBundle | None = None,
                 cross_encoder: CrossEncoder | None = None, *, models: dict[str, Any] | None = None,
                 query_overflow: str = "truncate", batching: BatchConfig = BatchConfig(),
                 stage_budgets_ms: dict[str, float] | None = None, embedding_cache: EmbeddingCache | None = None,
                 hybrid: HybridConfig = HybridConfig()):
        models = dict(models or {})
        models.update({name: model for name, model in (("cmc", cmc), ("ce", cross_encoder)) if model is not None})
        # the batch workers and the request threads share tokenizers: each gets a lock (models are shallow copies)
        locks = self.locks = TokenizerLocks()
        self.biencoder = locks.locked(biencoder)
        self.models = {name: locks.locked(model) for name, model in models.items() if model is not None}
        self.index = index
        self.query_overflow = query_overflow
        self.stage_budgets_ms = dict(stage_budgets_ms or {})
        self.embedding_cache = embedding_cache
        self.runners = Runners(batching)
        self.options = SearchOptions(batching, hybrid, dict(stage_budgets_ms or {}), DenseSearch(self.runners, self.awaited))
        self.memory = None  # a ClickMemory (sieve/feedback/memory.py) applied after the last stage; swapped live

    @property
    def batching(self) -> BatchConfig:
        return self.options.batching

    @property
    def cmc(self) -> CMCBundle | None:
        return self.models.get("cmc")

    @property
    def cross_encoder(self) -> CrossEncoder | None:
        """The in-process cross-encoder (None when the "ce" stage runs on a remote server)."""
        model = self.models.get("ce")
        return None if isinstance(model, RemoteCrossEncoder) else model

    @property
    def remote_ce(self) -> RemoteCrossEncoder | None:
        """The remote cross-encoder the "ce" stage calls (SIEVE_CE_URL), else None."""
        model = self.models.get("ce")
        return model if isinstance(model, RemoteCrossEncoder) else None

    def replace_model(self, name: str, model) -> None:
        """Serve `model` as stage `name` from the next request on (a live swap, e.g. a newly adapted CMC): one
        reference assignment of a new dict, so a request that already took the old model (check_params) finishes
        with it, and the new model's batch runner is its own (runner keys hold the model's id)."""
        self.models = {**self.models, name: self.locks.locked(model)}

    def close(self) -> None:
        self.runners.close()

    @staticmethod
    def normalise(query: str) -> str:
        return normalise_query(query)

    # -- query side -------------------------------------------------------------------------------------------
    def new_state(self, query: str, timeout_ms: int | None = None,
                  cancelled: threading.Event | None = None, count: bool = True) -> QueryState:
        """`count=False`: the query's tokens are counted later (`counted`), by the bi-encoder's batcher as it
        tokenizes the query anyway, unless a too-long query is rejected (then counted here, before any work)."""
        started = time.monotonic()
        query = normalise_query(query)
        if not query:
            raise RequestError("query is empty or only whitespace", field="query", allowed="a non-empty string")
        state = QueryState(query, index=self.index)
        state.deadline = Deadline(started + timeout_ms / 1000 if timeout_ms else None, cancelled)
        state.timeout_s = timeout_ms / 1000 if timeout_ms else None
        if count or self.query_overflow == "reject":
            self.counted(state, self.biencoder.count_tokens(query))
        return state

    def counted(self, state: QueryState, n_tokens: int) -> None:
        """The query's length against the bi-encoder's limit: 4xx (SIEVE_QUERY_OVERFLOW=reject) or the truncation
        warning, first among the warnings."""
        limit = self.biencoder.lengths.query_max_length
        state.query_tokens = n_tokens
        if n_tokens > limit:
            if self.query_overflow == "reject":
                raise QueryTooLong(f"query is {n_tokens} tokens; this server accepts at most {limit}",
                                   field="query", allowed=f"at most {limit} tokens (SIEVE_QUERY_MAX_LENGTH)")
            state.warnings.insert(0, f"query truncated from {n_tokens} to {limit} tokens")

    def encode_query(self, state: QueryState, towers: dict[str, TextEncoder], dense: DenseWant | None = None) -> None:
        """One encoding per distinct tower (a CMC whose query tower is the bi-encoder shares its encoding), each
        through its tower's batcher, all in flight at once; cached vectors skip the model. `dense`: the first
        stage's vector search, done by the bi-encoder's batcher with the encoding (pipeline/dense_batch.py) and left
        in `state.dense_hits`; its time is the "mips" timing, not the encoder's."""
        names_of: dict[int, list[str]] = {}
        for name, tower in towers.items():
            names_of.setdefault(id(tower), []).append(name)
        started = time.perf_counter()
        pending = []
        for names in names_of.values():
            tower = towers[names[0]]
            cached = self.embedding_cache if state.use_cache else None
            vector = cached.get(tower, state.query) if cached else None
            item = (state.query, dense) if dense is not None and tower is self.biencoder else state.query
            future = None if vector is not None else self.query_runner(tower).submit(item)
            pending.append((names, tower, vector, future))
        for names, tower, vector, future in pending:
            searched_ms = 0.0
            if future is not None:
                vector, n_tokens, hits = self.awaited(future, state, "the query encoder gave no vector")
                if hits is not None:
                    state.dense_hits, searched_ms = hits, hits.ms
                    state.timings_ms["mips"] = state.timings_ms.get("mips", 0.0) + hits.ms
                if tower is self.biencoder and state.query_tokens is None:
                    self.counted(state, n_tokens)
                if self.embedding_cache:
                    self.embedding_cache.put(tower, state.query, vector)
            state.timings_ms[f"{names[0]}_encode"] = max((time.perf_counter() - started) * 1000 - searched_ms, 0.0)
            for name in names:
                state.query_vectors[name] = vector

    @staticmethod
    def awaited(future, state: QueryState, what: str = "the query encoder gave no vector"):
        """What a runner computes for the first stage (the query vector, the vector search's candidates). The
        request cannot go on without it, so it is waited for past the deadline, but not forever: until the deadline
        plus the request's own timeout again (at least ENCODE_GRACE_S; a CPU server behind on its encodings still
        answers late rather than not at all), and not once the client has gone; then EncoderTimeout (a stalled
        batcher never holds a request thread for good). Without a deadline (library use) as long as it takes."""
        left = state.remaining_s()
        budget = None
        if left is not None:
            budget = 0.0 if state.cancelled else max(left, 0.0) + max(state.timeout_s or 0.0, ENCODE_GRACE_S)
        vector = wait(future, budget, state)
        if vector is None:
            why = "the client hung up" if state.cancelled else "its deadline and as long again passed"
            raise EncoderTimeout(f"{what} before {why}", client_gone=bool(state.cancelled))
        return vector

    def query_runner(self, tower: TextEncoder):
        """Its batcher answers each query's (vector, token count, DenseHits or None): an item is the query's text,
        or (text, DenseWant) to have the vector searched in the same batch (pipeline/dense_batch.py)."""
        return self.runners.get(f"query:{tower.name}:{id(tower)}", partial(encode_then_search, tower))

    def run(self, stages: Sequence[Stage], state: QueryState) -> QueryState:
        for stage in stages:
            if state.candidates is not None and len(state.candidates) == 0:
                break  # nothing was retrieved (BM25 with no query term in the index): nothing to rerank
            state = run_stage(stage, state, self.runners, self.stage_budgets_ms)
        return state

    @staticmethod
    def default_retriever(index) -> str:
        return "hybrid" if getattr(index, "has_lexical", False) else "be"

    def resolve(self, params: SearchParams, index=None) -> SearchParams:
        """The request with its retriever filled in: unset means hybrid on an index with a lexical part."""
        if params.retriever is not None:
            return params
        return replace(params, retriever=self.default_retriever(index if index is not None else self.index))

    # -- the registry -----------------------------------------------------------------------------------------
    def runnable(self, role: str | None = None, index=None) -> list[str]:
        """Stages of `role` (None: every stage that can rank texts for /rerank) this server can run on `index`: the
        allowed values an error names, never a stage the operator has not loaded (as /readyz lists them)."""
        index = index if index is not None else self.index
        specs = registry.stages(role) if role else [s for s in registry.stages() if s.rerank is not None]
        return [s.name for s in specs if not (s.optional and self.models.get(s.name) is None)
                and not ("lexical" in s.needs and not getattr(index, "has_lexical", False))]

    def spec(self, name: str, role: str, field: str, extra: tuple[str, ...] = ()) -> StageSpec:
        spec = registry.get(name)
        if spec is None or spec.role != role:
            names = [*self.runnable(role), *extra] or [f"{' | '.join(registry.names(role))} (none loaded on this server)"]
            allowed = " | ".join(names)
            raise RequestError(f"{field} {name!r} is not supported", field=field, allowed=allowed)
        return spec

    def model(self, spec: StageSpec, field: str):
        """The stage's loaded model (None for a stage that needs none); 4xx when the operator has not loaded it."""
        model = self.models.get(spec.name)
        if spec.optional and model is None:
            raise StageUnavailable(f"{spec.name} is not configured on this server", field=field,
                                   allowed=self.instead(spec, field))
        return model

    def instead(self, spec: StageSpec, field: str) -> str:
        """What a request may name in place of a stage this server has not loaded, and what would load it."""
        if field == "cross_encoder":
            return spec.unavailable or "false"
        how = re.search(r"\((.*)\)\s*$", spec.unavailable or "")
        role = None if field == "model" else spec.role
        names = [*self.runnable(role), *(["none"] if spec.role == RERANKER and field == "rerank" else [])]
        return " | ".join(names) + (f" ({spec.name}: {how.group(1)})" if how else "")

    def serves_cross_encoder(self, retriever: str | None, ce_model: str) -> bool:
        """Whether a /search that leaves cross_encoder unset gets it: the retriever leaves the head to the
        cross-encoder stage and the chosen cross-encoder is loaded."""
        first = registry.get(retriever or "")
        return not (first and first.extra.get("owns_cross_encoder")) and self.models.get(ce_model) is not None

    def default_rerank(self, retriever: str | None, configured: str) -> str:
        """/search `rerank` when unset: the retriever's own default (annCUR: none), else the configured one."""
        first = registry.get(retriever or "")
        return first.extra.get("default_rerank", configured) if first else configured

    # -- /search ----------------------------------------------------------------------------------------------
    def selected(self, params: SearchParams) -> list[tuple[StageSpec, str]]:
        """The specs a request names, each with the request field that named it, in plan order."""
        chosen = [(self.spec(params.retriever, RETRIEVER, "retriever"), "retriever")]
        if params.rerank != "none":
            chosen.append((self.spec(params.rerank, RERANKER, "rerank", ("none",)), "rerank"))
        if params.cross_encoder or params.ce_model != "ce":
            field = "ce_model" if params.ce_model != "ce" else "cross_encoder"
            chosen.append((self.spec(params.ce_model, CROSS_ENCODER, "ce_model"), field))
        return chosen

    def check_params(self, params: SearchParams, index=None) -> list[tuple[StageSpec, Any]]:
        index = index if index is not None else self.index
        if params.top_k > params.retrieve_k:
            raise RequestError(f"top_k {params.top_k} is larger than retrieve_k {params.retrieve_k}",
                               field="top_k", allowed=f"1 <= top_k <= retrieve_k ({params.retrieve_k})")
        if params.cmc_k > params.retrieve_k:
            raise RequestError(f"cmc_k {params.cmc_k} is larger than retrieve_k {params.retrieve_k}",
                               field="cmc_k", allowed=f"1 <= cmc_k <= retrieve_k ({params.retrieve_k})")
        chosen = self.selected(params)
        first = chosen[0][0]
        if check := first.extra.get("check"):
            check(params, self.models, index)  # a retriever's own rules (annCUR: no rerank, its own CE)
        plan = []
        for spec, field in chosen:
            if spec.role == CROSS_ENCODER and (not params.cross_encoder or first.extra.get("owns_cross_encoder")):
                continue
            if "lexical" in spec.needs and not getattr(index, "has_lexical", False):
                require_lexical_part(field)
            plan.append((spec, self.model(spec, field)))
        return plan

    def plan(self, checked: list[tuple[StageSpec, Any]], params: SearchParams, retrieve_k: int, index) -> list[Stage]:
        """The stages of the specs check_params returned, built for this request's index version."""
        stages: list[Stage] = []
        for spec, model in checked:
            k = params.cmc_k if spec.role == CROSS_ENCODER else retrieve_k
            stages += spec.build(BuildContext(model, index, k, params, self.options, self.models))
        return stages

    def towers(self, checked: list[tuple[StageSpec, Any]]) -> dict[str, TextEncoder]:
        """The query encodings the checked stages read."""
        towers: dict[str, TextEncoder] = {}
        for spec, model in checked:
            if spec.query_towers:
                towers.update(spec.query_towers(model, self.biencoder))
        return towers

    def search(self, params: SearchParams) -> Outcome:
        with self.runners.in_flight:  # the batchers wait for company only while other requests are in flight
            return self._search(params)

    def _search(self, params: SearchParams) -> Outcome:
        started = time.perf_counter()
        state = self.new_state(params.query, params.timeout_ms, params.cancelled, count=False)
        index = state.index
        params = self.resolve(params, index)
        checked = self.check_params(params, index)
        state.use_cache = params.use_cache
        retrieve_k = params.retrieve_k
        if retrieve_k > index.size:
            state.warnings.append(f"retrieve_k {retrieve_k} clamped to the index size {index.size}")
            retrieve_k = index.size
        stages = self.plan(checked, params, retrieve_k, index)
        asks = getattr(stages[0], "dense_want", None)  # a first stage that searches with the bi-encoder's vector
        self.encode_query(state, self.towers(checked), asks() if asks else None)
        if state.query_tokens is None:  # not encoded by the bi-encoder's batcher (a cached vector, BM25 alone)
            self.counted(state, self.biencoder.count_tokens(state.query))
        state = self.run(stages, state)
        memory = self.memory  # one read: a swap mid-request does not mix two memories
        if memory is not None:
            vectors = state.query_vectors  # the one the impressions log (records.first_stage)
            vector = vectors.get("cmc", vectors.get("be")) if memory.w_near else None
            state.candidates = remembered(memory, params.query, state.candidates, index,
                                          None if vector is None else vector.detach().float().cpu().numpy())
        state.timings_ms["total"] = (time.perf_counter() - started) * 1000
        top = state.candidates.take(np.arange(min(params.top_k, len(state.candidates))))
        return Outcome(top, state.ran[-1], state, index.version, index=index)

    # -- /rerank ----------------------------------------------------------------------------------------------
    def rerank(self, query: str, items: Sequence[RerankItem], model: str, top_n: int,
               timeout_ms: int | None = None, max_tokens: int | None = None,
               cancelled: threading.Event | None = None) -> Outcome:
        """Any stage whose spec can rank the caller's texts (`rerank`). Out of time, CMC falls back to <query,
        candidate> order and the cross-encoder to the caller's order; when time runs out while texts are still
        being encoded, to the caller's order too. `max_tokens`: the most the models may read (413 past it)."""
        with self.runners.in_flight:
            return self._rerank(query, items, model, top_n, timeout_ms, max_tokens, cancelled)

    def _rerank(self, query: str, items: Sequence[RerankItem], model: str, top_n: int, timeout_ms: int | None,
                max_tokens: int | None, cancelled: threading.Event | None) -> Outcome:
        started = time.perf_counter()
        spec = registry.get(model)
        if spec is None or spec.rerank is None:
            allowed = " | ".join(self.runnable())
            raise RequestError(f"model {model!r} is not supported", field="model", allowed=allowed)
        loaded = self.model(spec, "model")
        state = self.new_state(query, timeout_ms, cancelled)
        index = state.index
        texts = resolve_texts(index, items)
        ctx = RerankContext(state, items, texts, index, loaded, self.biencoder, self.options, max_tokens,
                            lambda towers: self.encode_query(state, towers))
        stages = spec.rerank(ctx)
        if stages is None:
            state.skipped.append(spec.name)
            stages = []
        state = self.run(stages, state)
        state.timings_ms["total"] = (time.perf_counter() - started) * 1000
        top = state.candidates.take(np.arange(min(top_n, len(state.candidates))))
        return Outcome(top, state.ran[-1] if state.ran else "input", state, index.version, index=index)


def remembered(memory, query: str, cands: Candidates, index, vector=None) -> Candidates:
    """The candidates re-sorted by their answer `score` plus the click memory's boost (sieve/feedback/memory.py),
    as the score column "clicks"; unchanged where the memory knows none of them."""
    if not len(cands) or (cands.ids is None and (cands.rows < 0).any()):
        return cands
    ids = cands.ids if cands.ids is not None else index.ids(cands.rows)
    boost = memory.boost(memory.key_of(query), ids, vector)
    if not boost.any():
        return cands
    score = answer_scores(cands.scores) + boost
    return cands.with_scores(registry.CLICKS_SCORE, score).take(np.argsort(-score, kind="stable"))


def answer_scores(scores: dict) -> np.ndarray:
    """The answer's `score` of each candidate: the last ranking column when its stage scored them all (sorted by
    it already: CMC's), else ranked_scores (a cross-encoder that scored only the head)."""
    last = [v for k, v in scores.items() if k in registry.ranking_keys()][-1]
    if not np.isnan(last).any():
        return last.astype(np.float64)
    return ranked_scores(scores)


def require_lexical_part(field: str) -> None:
    raise StageUnavailable("this index has no lexical (BM25) part", field=field,
                           allowed="be (the operator rebuilds the index with `sieve index build`, which "
                                   "adds BM25 unless --no-lexical)")
