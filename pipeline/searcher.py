"""The front object: builds the stage list a request asks for and runs it. No HTTP, no settings object."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from models.cmc_checkpoint import CMCBundle
from models.cross_encoder import CrossEncoder
from models.text_encoder import TextEncoder
from pipeline.candidates import Candidates
from pipeline.errors import QueryTooLong, RequestError, StageUnavailable
from pipeline.stages import CMCRerank, CrossEncoderRerank, Retrieve, Stage
from pipeline.state import QueryState

RERANKERS = ("cmc", "none")


@dataclass(frozen=True)
class SearchParams:
    query: str
    top_k: int = 10
    retrieve_k: int = 512
    rerank: str = "cmc"
    cmc_k: int = 64  # candidates CMC passes on, and the number the cross-encoder scores
    cross_encoder: bool = False


@dataclass(frozen=True)
class RerankItem:
    """One /rerank input: a text, an indexed id, or both."""

    text: str | None = None
    id: str | None = None


@dataclass
class Outcome:
    candidates: Candidates
    final_stage: str
    state: QueryState
    index_version: int
    documents: list = field(default_factory=list)


class Searcher:
    def __init__(self, biencoder: TextEncoder, index, cmc: CMCBundle | None = None,
                 cross_encoder: CrossEncoder | None = None, *, query_overflow: str = "truncate"):
        self.biencoder = biencoder
        self.index = index
        self.cmc = cmc
        self.cross_encoder = cross_encoder
        self.query_overflow = query_overflow
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="query-encoder")

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    # -- query side -------------------------------------------------------------------------------------------
    def new_state(self, query: str) -> QueryState:
        query = query.strip()
        if not query:
            raise RequestError("query is empty or only whitespace", field="query", allowed="a non-empty string")
        limit = self.biencoder.lengths.query_max_length
        state = QueryState(query)
        n_tokens = self.biencoder.count_tokens(query)
        if n_tokens > limit:
            if self.query_overflow == "reject":
                raise QueryTooLong(f"query is {n_tokens} tokens; this server accepts at most {limit}",
                                   field="query", allowed=f"at most {limit} tokens (SIEVE_QUERY_MAX_LENGTH)")
            state.warnings.append(f"query truncated from {n_tokens} to {limit} tokens")
        return state

    def encode_query(self, state: QueryState, towers: dict[str, TextEncoder]) -> None:
        """The bi-encoder and CMC query towers run concurrently; each stage's time is recorded on its own.
        A CMC whose query tower is the bi-encoder itself (frozen towers) shares its single encoding."""
        names_of: dict[int, list[str]] = {}
        for name, tower in towers.items():
            names_of.setdefault(id(tower), []).append(name)
        jobs = [(names, towers[names[0]]) for names in names_of.values()]

        def run(names: list[str], tower: TextEncoder):
            start = time.perf_counter()
            vector = tower.encode_queries([state.query])[0]
            return names, vector, (time.perf_counter() - start) * 1000

        for names, vector, ms in self.pool.map(lambda job: run(*job), jobs):
            state.timings_ms[f"{names[0]}_encode"] = ms
            for name in names:
                state.query_vectors[name] = vector

    # -- /search ----------------------------------------------------------------------------------------------
    def plan(self, params: SearchParams, retrieve_k: int) -> list[Stage]:
        stages: list[Stage] = [Retrieve(self.index, retrieve_k)]
        if params.rerank == "cmc":
            # CMC ranks all retrieve_k; the CE then scores its top cmc_k (K') and the rest keep CMC's order below
            stages.append(CMCRerank(self.require_cmc(), self.index))
        if params.cross_encoder:
            stages.append(CrossEncoderRerank(self.require_cross_encoder(), self.index, params.cmc_k))
        return stages

    def search(self, params: SearchParams) -> Outcome:
        started = time.perf_counter()
        self.check_params(params)
        state = self.new_state(params.query)
        retrieve_k = params.retrieve_k
        if retrieve_k > self.index.size:
            state.warnings.append(f"retrieve_k {retrieve_k} clamped to the index size {self.index.size}")
            retrieve_k = self.index.size
        stages = self.plan(params, retrieve_k)
        towers = {"be": self.biencoder}
        if params.rerank == "cmc":
            towers["cmc"] = self.cmc.query_tower
        self.encode_query(state, towers)
        for stage in stages:
            state = stage(state)
        state.timings_ms["total"] = (time.perf_counter() - started) * 1000
        top = state.candidates.take(np.arange(min(params.top_k, len(state.candidates))))
        return Outcome(top, stages[-1].name, state, self.index.version)

    def check_params(self, params: SearchParams) -> None:
        if params.rerank not in RERANKERS:
            raise RequestError(f"rerank {params.rerank!r} is not supported", field="rerank", allowed=" | ".join(RERANKERS))
        if params.top_k > params.retrieve_k:
            raise RequestError(f"top_k {params.top_k} is larger than retrieve_k {params.retrieve_k}",
                               field="top_k", allowed=f"1 <= top_k <= retrieve_k ({params.retrieve_k})")
        if params.cmc_k > params.retrieve_k:
            raise RequestError(f"cmc_k {params.cmc_k} is larger than retrieve_k {params.retrieve_k}",
                               field="cmc_k", allowed=f"1 <= cmc_k <= retrieve_k ({params.retrieve_k})")
        if params.rerank == "cmc":
            self.require_cmc()
        if params.cross_encoder:
            self.require_cross_encoder()

    def require_cmc(self) -> CMCBundle:
        if self.cmc is None:
            raise StageUnavailable("CMC is disabled on this server", field="rerank", allowed="none (or enable SIEVE_CMC_ENABLED)")
        return self.cmc

    def require_cross_encoder(self) -> CrossEncoder:
        if self.cross_encoder is None:
            raise StageUnavailable(
                "no cross-encoder is configured on this server", field="cross_encoder",
                allowed="false (the server operator sets SIEVE_CROSS_ENCODER_PATH to a local checkpoint directory)")
        return self.cross_encoder

    # -- /rerank ----------------------------------------------------------------------------------------------
    def rerank(self, query: str, items: Sequence[RerankItem], model: str, top_n: int) -> Outcome:
        started = time.perf_counter()
        state = self.new_state(query)
        texts = self.resolve_texts(items)
        if model == "cmc":
            bundle = self.require_cmc()
            self.encode_query(state, {"cmc": bundle.query_tower})
            state.candidates = self.rerank_candidates(items, texts, bundle, state)
            state = CMCRerank(bundle, self.index)(state)
        elif model == "ce":
            state.candidates = Candidates(rows=np.full(len(items), -1), texts=texts)
            state = CrossEncoderRerank(self.require_cross_encoder(), self.index, len(items))(state)
        else:
            raise RequestError(f"model {model!r} is not supported", field="model", allowed="cmc | ce")
        state.timings_ms["total"] = (time.perf_counter() - started) * 1000
        top = state.candidates.take(np.arange(min(top_n, len(state.candidates))))
        return Outcome(top, model, state, self.index.version)

    def resolve_texts(self, items: Sequence[RerankItem]) -> list[str]:
        """Each item's text: its own, or the indexed document's when only an id was given."""
        id_only = [item.id for item in items if item.text is None]
        stored = {}
        if id_only:
            rows = self.index.rows_for_ids(id_only)
            stored = {doc.id: doc.full_text for doc in self.index.documents(rows)}
        return [item.text if item.text is not None else stored[item.id] for item in items]

    def rerank_candidates(self, items: Sequence[RerankItem], texts: list[str], bundle: CMCBundle,
                          state: QueryState) -> Candidates:
        """Indexed documents reuse their stored vectors; any other text goes through the candidate tower now."""
        indexed = self.indexed_rows(items, texts)
        store = "cmc" if bundle.config.mode == "separate" else None
        tower = bundle.candidate_tower or self.biencoder
        vectors = np.empty((len(items), tower.dim), dtype=np.float32)
        known = [i for i, row in enumerate(indexed) if row >= 0]
        if known:
            vectors[known] = self.index.embeddings([indexed[i] for i in known], store=store)
        fresh = [i for i, row in enumerate(indexed) if row < 0]
        if fresh:
            with state.timed("candidate_encode"):
                vectors[fresh] = tower.encode_documents([texts[i] for i in fresh], progress=False)
        state.counts["candidate_encode"] = len(fresh)
        return Candidates(rows=np.asarray(indexed), vectors=vectors, texts=texts)

    def indexed_rows(self, items: Sequence[RerankItem], texts: list[str]) -> list[int]:
        """Index row of each item whose id is indexed and whose text (if given) is the indexed text, else -1."""
        ids = [item.id for item in items if item.id is not None and self.index.has_id(item.id)]
        if not ids:
            return [-1] * len(items)
        rows = dict(zip(ids, self.index.rows_for_ids(ids)))
        docs = {doc.id: doc.full_text for doc in self.index.documents(list(rows.values()))}
        return [rows[item.id] if item.id in rows and docs[item.id] == text else -1 for item, text in zip(items, texts)]
