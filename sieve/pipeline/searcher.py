"""The front object: builds the stage list a request asks for and runs it. No HTTP, no settings object.

Every request reads one index version from start to end (`state.index`), so a live swap of `self.index` never
mixes versions inside a request. Model work goes through per-model runners (pipeline/batching.py): batched
across concurrent requests, or one by one when batching is off; either way a stage can be given up on when its
time budget runs out (pipeline/runner.py).
"""
from __future__ import annotations

import time
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Protocol, Sequence

import numpy as np
import torch

from sieve.models.cmc_checkpoint import CMCBundle
from sieve.models.cross_encoder import CrossEncoder
from sieve.models.mix_runtime import MixRuntime
from sieve.models.text_encoder import TextEncoder
from sieve.pipeline.anncur_stage import AnnCUR, anncur_stages
from sieve.pipeline.batching import BatchConfig, Runners
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.first_stage import HybridConfig, HybridRetrieve, LexicalRetrieve
from sieve.pipeline.errors import QueryTooLong, RequestError, StageUnavailable
from sieve.pipeline.rerank_inputs import RerankItem, check_work, indexed_rows, rerank_candidates, resolve_texts
from sieve.pipeline.remote_ce import RemoteCrossEncoder, RemoteCrossEncoderRerank
from sieve.pipeline.rerankers import LateCrossEncoderRerank, MixRerank, locked_copy
from sieve.pipeline.runner import run_stage
from sieve.pipeline.stages import CMCRerank, CrossEncoderRerank, Retrieve, Stage
from sieve.pipeline.state import QueryState
from sieve.pipeline.threadsafe import with_locked_tokenizers

RERANKERS = ("cmc", "mix", "none")
CE_MODELS = ("ce", "ce_late")  # the cross-encoder that scores the head: the plain one or the late-interaction one
RETRIEVERS = ("be", "bm25", "hybrid", "anncur")
NEEDS_QUERY_VECTOR = ("be", "hybrid")  # first stages that search with the bi-encoder's query vector
__all__ = ["Searcher", "SearchParams", "RerankItem", "Outcome", "normalise_query"]


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


class Searcher:
    def __init__(self, biencoder: TextEncoder, index, cmc: CMCBundle | None = None,
                 cross_encoder: CrossEncoder | None = None, *, query_overflow: str = "truncate",
                 batching: BatchConfig = BatchConfig(), stage_budgets_ms: dict[str, float] | None = None,
                 embedding_cache: EmbeddingCache | None = None, anncur: AnnCUR | None = None,
                 mix: MixRuntime | None = None, late_ce: CrossEncoder | None = None,
                 hybrid: HybridConfig = HybridConfig(), remote_ce: RemoteCrossEncoder | None = None):
        # the batch workers and the request threads share tokenizers: each gets a lock (models are shallow copies)
        self.biencoder, self.cmc, self.cross_encoder = with_locked_tokenizers(biencoder, cmc, cross_encoder)
        self.index = index
        self.query_overflow = query_overflow
        self.batching = batching
        self.stage_budgets_ms = dict(stage_budgets_ms or {})
        self.embedding_cache = embedding_cache
        self.runners = Runners(batching)
        self.anncur = self.locked_anncur(anncur, cross_encoder)
        self.mix, self.late_ce = locked_copy(mix), locked_copy(late_ce)
        self.hybrid = hybrid
        self.remote_ce = remote_ce  # remote-ce wiring: set = the "ce" stage runs on another server (SIEVE_CE_URL)

    def locked_anncur(self, anncur: AnnCUR | None, cross_encoder) -> AnnCUR | None:
        """annCUR's cross-encoder with a locked tokenizer: the CE stage's own copy when it is the same model."""
        if anncur is None:
            return None
        ce = self.cross_encoder if anncur.cross_encoder is cross_encoder else \
            with_locked_tokenizers(None, None, anncur.cross_encoder)[2]
        return AnnCUR(anncur.index, ce)

    def close(self) -> None:
        self.runners.close()
        if self.remote_ce is not None:  # remote-ce wiring
            self.remote_ce.close()

    @staticmethod
    def normalise(query: str) -> str:
        return normalise_query(query)

    # -- query side -------------------------------------------------------------------------------------------
    def new_state(self, query: str, timeout_ms: int | None = None) -> QueryState:
        started = time.monotonic()
        query = normalise_query(query)
        if not query:
            raise RequestError("query is empty or only whitespace", field="query", allowed="a non-empty string")
        limit = self.biencoder.lengths.query_max_length
        state = QueryState(query, index=self.index)
        state.deadline = started + timeout_ms / 1000 if timeout_ms else None
        n_tokens = self.biencoder.count_tokens(query)
        if n_tokens > limit:
            if self.query_overflow == "reject":
                raise QueryTooLong(f"query is {n_tokens} tokens; this server accepts at most {limit}",
                                   field="query", allowed=f"at most {limit} tokens (SIEVE_QUERY_MAX_LENGTH)")
            state.warnings.append(f"query truncated from {n_tokens} to {limit} tokens")
        return state

    def encode_query(self, state: QueryState, towers: dict[str, TextEncoder]) -> None:
        """One encoding per distinct tower (a CMC whose query tower is the bi-encoder shares its encoding), each
        through its tower's batcher, all in flight at once; cached vectors skip the model."""
        names_of: dict[int, list[str]] = {}
        for name, tower in towers.items():
            names_of.setdefault(id(tower), []).append(name)
        started = time.perf_counter()
        pending = []
        for names in names_of.values():
            tower = towers[names[0]]
            cached = self.embedding_cache if state.use_cache else None
            vector = cached.get(tower, state.query) if cached else None
            future = None if vector is not None else self.query_runner(tower).submit(state.query)
            pending.append((names, tower, vector, future))
        for names, tower, vector, future in pending:
            if future is not None:
                vector = future.result()
                if self.embedding_cache:
                    self.embedding_cache.put(tower, state.query, vector)
            state.timings_ms[f"{names[0]}_encode"] = (time.perf_counter() - started) * 1000
            for name in names:
                state.query_vectors[name] = vector

    def query_runner(self, tower: TextEncoder):
        return self.runners.get(f"query:{tower.name}:{id(tower)}", lambda texts: list(tower.encode_queries(texts)))

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

    # -- /search ----------------------------------------------------------------------------------------------
    def plan(self, params: SearchParams, retrieve_k: int, index=None) -> list[Stage]:
        index = index if index is not None else self.index
        if params.retriever == "anncur":
            rerank_k = params.cmc_k if params.cross_encoder else 0
            return anncur_stages(self.require_anncur(index), retrieve_k, rerank_k, index, self.batching.ce_tokens)
        stages: list[Stage] = [self.first_stage(params.retriever, index, retrieve_k)]
        if params.rerank == "cmc":
            # CMC ranks all retrieve_k; the CE then scores its top cmc_k (K') and the rest keep CMC's order below
            stages.append(CMCRerank(self.require_cmc(), index, self.batching.cmc_candidates))
        elif params.rerank == "mix":
            stages.append(MixRerank(self.require_mix(), index))  # like CMC: ranks all retrieve_k
        if params.cross_encoder:
            stages.append(self.ce_stage(params.ce_model, index, params.cmc_k))
        return stages

    def first_stage(self, retriever: str, index, k: int) -> Stage:
        if retriever == "bm25":
            return LexicalRetrieve(self.require_lexical(index), k)
        if retriever == "hybrid":
            return HybridRetrieve(self.require_lexical(index), k, self.hybrid)
        return Retrieve(index, k)

    def require_lexical(self, index):
        if not getattr(index, "has_lexical", False):
            raise StageUnavailable("this index has no lexical (BM25) part", field="retriever",
                                   allowed="be (the operator rebuilds the index with `sieve index build`, which "
                                           "adds BM25 unless --no-lexical)")
        return index

    def ce_stage(self, model: str, index, k: int) -> Stage:
        if model == "ce_late":
            return LateCrossEncoderRerank(self.require_late_ce(), index, k, self.batching.ce_tokens)
        if self.remote_ce is not None:  # remote-ce wiring
            return RemoteCrossEncoderRerank(self.remote_ce, index, k, self.stage_budgets_ms)
        return CrossEncoderRerank(self.require_cross_encoder(), index, k, self.batching.ce_tokens)

    def search(self, params: SearchParams) -> Outcome:
        started = time.perf_counter()
        state = self.new_state(params.query, params.timeout_ms)
        index = state.index
        params = self.resolve(params, index)
        self.check_params(params)
        state.use_cache = params.use_cache
        retrieve_k = params.retrieve_k
        if retrieve_k > index.size:
            state.warnings.append(f"retrieve_k {retrieve_k} clamped to the index size {index.size}")
            retrieve_k = index.size
        stages = self.plan(params, retrieve_k, index)
        towers = {"be": self.biencoder} if params.retriever in NEEDS_QUERY_VECTOR else {}  # BM25, annCUR: none
        if params.rerank == "cmc":
            towers["cmc"] = self.cmc.query_tower
        self.encode_query(state, towers)
        state = self.run(stages, state)
        state.timings_ms["total"] = (time.perf_counter() - started) * 1000
        top = state.candidates.take(np.arange(min(params.top_k, len(state.candidates))))
        return Outcome(top, state.ran[-1], state, index.version, index=index)

    def check_params(self, params: SearchParams) -> None:
        if params.rerank not in RERANKERS:
            raise RequestError(f"rerank {params.rerank!r} is not supported", field="rerank", allowed=" | ".join(RERANKERS))
        if params.retriever not in RETRIEVERS:
            raise RequestError(f"retriever {params.retriever!r} is not supported", field="retriever",
                               allowed=" | ".join(RETRIEVERS))
        if params.retriever == "anncur":
            self.check_anncur(params)
        if params.retriever in ("bm25", "hybrid"):
            self.require_lexical(self.index)
        if params.top_k > params.retrieve_k:
            raise RequestError(f"top_k {params.top_k} is larger than retrieve_k {params.retrieve_k}",
                               field="top_k", allowed=f"1 <= top_k <= retrieve_k ({params.retrieve_k})")
        if params.cmc_k > params.retrieve_k:
            raise RequestError(f"cmc_k {params.cmc_k} is larger than retrieve_k {params.retrieve_k}",
                               field="cmc_k", allowed=f"1 <= cmc_k <= retrieve_k ({params.retrieve_k})")
        if params.ce_model not in CE_MODELS:
            raise RequestError(f"ce_model {params.ce_model!r} is not supported", field="ce_model",
                               allowed=" | ".join(CE_MODELS))
        if params.rerank == "cmc":
            self.require_cmc()
        if params.rerank == "mix":
            self.require_mix()
        if params.cross_encoder and params.retriever != "anncur":
            self.require_late_ce() if params.ce_model == "ce_late" else self.require_cross_encoder()

    def check_anncur(self, params: SearchParams) -> None:
        if params.rerank != "none":
            raise RequestError(f"rerank {params.rerank!r} reorders bi-encoder candidates by their stored vectors; "
                               "annCUR's come from the cross-encoder itself", field="rerank",
                               allowed="none with retriever anncur (cross_encoder: true reranks exactly)")
        if params.ce_model != "ce":
            raise RequestError("annCUR reranks with the cross-encoder that built its index", field="ce_model",
                               allowed="ce with retriever anncur")
        self.require_anncur(self.index)

    def require_anncur(self, index) -> AnnCUR:
        if self.anncur is None:
            raise StageUnavailable("no annCUR index is configured on this server", field="retriever",
                                   allowed="be (the server operator sets SIEVE_ANNCUR_DIR to an index built by "
                                           "`sieve index anncur`)")
        if self.anncur.index.corpus_hash != index.manifest.corpus_hash:
            raise StageUnavailable("the annCUR index was built from other documents than the live index holds "
                                   "(the index changed since)", field="retriever",
                                   allowed="be, until the operator rebuilds it with `sieve index anncur`")
        return self.anncur

    def require_cmc(self) -> CMCBundle:
        if self.cmc is None:
            raise StageUnavailable("CMC is disabled on this server", field="rerank", allowed="none (or enable SIEVE_CMC_ENABLED)")
        return self.cmc

    def serves_cross_encoder(self, retriever: str | None, ce_model: str) -> bool:
        """Whether a /search that leaves cross_encoder unset gets it: a first stage other than annCUR retrieves
        and the chosen cross-encoder is loaded."""
        ce = self.late_ce if ce_model == "ce_late" else (self.cross_encoder or self.remote_ce)  # remote-ce wiring
        return retriever != "anncur" and ce is not None

    def require_cross_encoder(self) -> CrossEncoder | RemoteCrossEncoder:
        if self.remote_ce is not None:  # remote-ce wiring
            return self.remote_ce
        if self.cross_encoder is None:
            raise StageUnavailable(
                "no cross-encoder is configured on this server", field="cross_encoder",
                allowed="false (the server operator sets SIEVE_CROSS_ENCODER_PATH to a local checkpoint directory)")
        return self.cross_encoder

    def require_mix(self) -> MixRuntime:
        if self.mix is None:
            raise StageUnavailable("no MixEncoder is configured on this server", field="rerank",
                                   allowed="cmc | none (the server operator sets SIEVE_MIX_PATH)")
        return self.mix

    def require_late_ce(self) -> CrossEncoder:
        if self.late_ce is None:
            raise StageUnavailable("no late-interaction cross-encoder is configured on this server", field="ce_model",
                                   allowed="ce (the server operator sets SIEVE_LATE_CE_PATH to a late-interaction checkpoint)")
        return self.late_ce

    # -- /rerank ----------------------------------------------------------------------------------------------
    def rerank(self, query: str, items: Sequence[RerankItem], model: str, top_n: int,
               timeout_ms: int | None = None, max_tokens: int | None = None) -> Outcome:
        """CMC falls back to <query, candidate> order, the cross-encoder to the caller's order, when out of time;
        when time runs out while new texts are still being encoded for CMC, to the caller's order too.
        `max_tokens`: the most the models may read for this request (413 past it)."""
        started = time.perf_counter()
        state = self.new_state(query, timeout_ms)
        index = state.index
        texts = resolve_texts(index, items)
        stages: list[Stage] = []
        if model == "cmc":
            bundle = self.require_cmc()
            tower = bundle.candidate_tower or self.biencoder
            rows = indexed_rows(index, items, texts)
            check_work([t for t, row in zip(texts, rows) if row < 0], tower.lengths.doc_max_length, max_tokens)
            self.encode_query(state, {"cmc": bundle.query_tower})
            state.candidates = rerank_candidates(index, items, texts, bundle, self.biencoder, state)
            if state.candidates is None:  # out of time while encoding: nothing scored them all
                state.candidates = Candidates(rows=np.asarray(rows), texts=texts)
                state.skipped.append("cmc")
            else:
                state.ran.append("retrieve")
                stages.append(CMCRerank(bundle, index, self.batching.cmc_candidates))
        elif model in CE_MODELS:
            stage = self.ce_stage(model, index, len(items))
            check_work(texts, stage.cross_encoder.lengths.max_length, max_tokens)
            state.candidates = Candidates(rows=np.full(len(items), -1), texts=texts)
            stages.append(stage)
        elif model == "mix":  # indexed documents reuse their stored context embeddings
            mix, rows = self.require_mix(), indexed_rows(index, items, texts)
            check_work([t for t, row in zip(texts, rows) if row < 0], mix.lengths.doc_max_length, max_tokens)
            state.candidates = Candidates(rows=np.asarray(rows), texts=texts)
            stages.append(MixRerank(mix, index))
        else:
            raise RequestError(f"model {model!r} is not supported", field="model", allowed="cmc | ce | ce_late | mix")
        state = self.run(stages, state)
        state.timings_ms["total"] = (time.perf_counter() - started) * 1000
        top = state.candidates.take(np.arange(min(top_n, len(state.candidates))))
        return Outcome(top, state.ran[-1] if state.ran else "input", state, index.version, index=index)
