"""Thin handlers: validate, call the pipeline, shape the reply. Sync functions, so FastAPI runs them in its
thread pool; model work runs in the per-model batch workers, never on the event loop."""
from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from sieve.pipeline import registry
from sieve.pipeline.errors import RequestError
from sieve.pipeline.searcher import RerankItem, SearchParams
from sieve.service import schemas, workers
from sieve.service.cache import Caches
from sieve.service.components import Components
from sieve.service.config import Settings
from sieve.service.errors import error_body
from sieve.service.limits import Limits, cpu_limits
from sieve.service.metrics import Metrics
from sieve.service.protection import RateLimited, Unauthorized
from sieve.service.responses import (body_json, cohere_rerank_response, json_response, rerank_response,
                                     response_model, search_body, to_json)

router = APIRouter()
# 503: encoder_timeout (/search, /rerank), write_pending (writes), index_unavailable (Qdrant), models still loading
ERRORS = {code: {"model": schemas.ErrorResponse} for code in (400, 401, 413, 422, 429, 503)}
bearer = HTTPBearer(auto_error=False, description="API key, when the server has SIEVE_API_KEYS or SIEVE_API_KEYS_FILE")


# The dependencies are coroutines: FastAPI runs a plain `def` dependency in the thread pool, a hop per request each.
async def get_components(request: Request) -> Components:
    """The loaded components, with the index brought up to date first when another worker process of this server
    published a version since (service/workers.py: read your writes across workers)."""
    state = request.app.state
    if getattr(state.updater, "behind", None) is not None and state.updater.behind():
        await run_in_threadpool(state.updater.catch_up)  # loads a version: not on the event loop
    return state.components


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_caches(request: Request) -> Caches:
    return request.app.state.caches


async def guard(request: Request,
                credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """API key (when configured), then the caller's rate limit; the key itself is never logged or stored. Failed
    keys spend a bucket of the client address, so guessing keys is rate limited too (429 once it is empty). On the
    event loop: the checks are a few comparisons in memory, except a rate limit kept in Redis (a network call),
    which goes to the thread pool."""
    state = request.app.state
    header = f"{credentials.scheme} {credentials.credentials}" if credentials else request.headers.get("authorization")
    address = request.client.host if request.client else "anonymous"
    if state.limiter.remote:
        await run_in_threadpool(check_caller, state, header, address)
    else:
        check_caller(state, header, address)


def check_caller(state, header: str | None, address: str) -> None:
    try:
        caller = state.auth.identify(header)
    except Unauthorized:
        state.metrics.rejected.labels(reason="unauthorized").inc()
        limit(state, f"auth-failed:{address}")
        raise
    limit(state, caller or address)


def limit(state, caller: str) -> None:
    try:
        state.limiter.check(caller)
    except RateLimited:
        state.metrics.rejected.labels(reason="rate_limited").inc()
        raise


ComponentsDep = Annotated[Components, Depends(get_components)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
CachesDep = Annotated[Caches, Depends(get_caches)]
Guarded = [Depends(guard)]


def check_limit(value: int, limit: int, field: str, setting: str) -> None:
    if value > limit:
        raise RequestError(f"{field} {value} is above this server's limit {limit}", field=field,
                           allowed=f"at most {limit} ({setting})")


def limits_of(components, settings: Settings) -> Limits:
    """The work cap and default deadline in force: the device's (service/limits.py), else the settings'."""
    return components.limits or cpu_limits(settings)


def timeout_of(body, limits: Limits) -> int | None:
    return getattr(body, "timeout_ms", None) or limits.default_timeout_ms


def retrieve_k_of(body: schemas.SearchRequest, index) -> int:
    """The request's retrieve_k; left unset, the default cut to the index size, so a small index (the demo's) does
    not warn on every search that a value the client never sent was clamped."""
    if "retrieve_k" in body.model_fields_set:
        return body.retrieve_k
    return max(body.top_k, body.cmc_k, min(body.retrieve_k, index.size))


def hang_up(request: Request):
    """The event set when this request's client hangs up (protection.watched), None outside the work paths."""
    return getattr(request.state, "cancelled", None)


@router.post("/search", response_model=schemas.SearchResponse, responses=ERRORS, tags=["search"], dependencies=Guarded)
def search(body: schemas.SearchRequest, request: Request, components: ComponentsDep, settings: SettingsDep,
           metrics: MetricsDep, caches: CachesDep):
    """Retrieve with the bi-encoder, optionally rerank with CMC and the cross-encoder, return the top_k.
    `Cache-Control: no-cache` asks for fresh work: no cached result or query vector is used (the answer is still
    stored), so a benchmark or `sieve eval --server` measures the models, not the cache."""
    check_limit(body.top_k, settings.max_top_k, "top_k", "SIEVE_MAX_TOP_K")
    check_limit(body.retrieve_k, settings.max_retrieve_k, "retrieve_k", "SIEVE_MAX_RETRIEVE_K")
    started = time.perf_counter()
    searcher = components.searcher
    fresh = "no-cache" in request.headers.get("cache-control", "").lower()
    retriever = body.retriever or searcher.default_retriever(searcher.index)
    rerank = body.rerank or searcher.default_rerank(retriever, settings.default_rerank)
    use_ce = body.cross_encoder if body.cross_encoder is not None else \
        settings.default_cross_encoder and searcher.serves_cross_encoder(retriever, body.ce_model)
    deadline = timeout_of(body, limits_of(components, settings))
    params = SearchParams(body.query, body.top_k, retrieve_k_of(body, searcher.index), rerank, body.cmc_k, use_ce,
                          deadline, retriever=retriever, ce_model=body.ce_model,
                          use_cache=not fresh, cancelled=hang_up(request))
    key_params = body.model_dump(exclude={"timeout_ms"}) | {"query": searcher.normalise(body.query),
                                                            "cross_encoder": use_ce, "retriever": retriever,
                                                            "retrieve_k": params.retrieve_k,
                                                            "rerank": rerank,
                                                            "server": caches.fingerprint}
    hit = None
    # the index's identity read BEFORE the search keys both the look-up and the store: an answer computed while a
    # write was being acknowledged is stored under the identity from before it, which that write ended
    key = caches.results.key(key_params, searcher.index) if caches.results else None
    request_id, feedback = uuid.uuid4().hex, request.app.state.feedback
    explore = feedback.pick_explore() if feedback else False  # False at once unless SIEVE_FEEDBACK_EXPLORE_FRACTION
    if caches.results and not fresh and not explore:
        hit = caches.results.get(key)
    if hit:
        timings = {"total": (time.perf_counter() - started) * 1000}
        response = schemas.SearchResponse(**{**hit, "timings_ms": timings, "cached": True, "request_id": request_id})
        return json_response(feedback.on_search(request_id, body.query, response) if feedback else response)
    outcome = searcher.search(params)
    metrics.observe(outcome.state.timings_ms, outcome.state.counts)
    answer = search_body(outcome, body.return_documents, request_id)
    if outcome.partial:  # a partial answer is never cached: the next request may have the time for all of it
        metrics.partial.labels(endpoint="/search", skipped=",".join(outcome.state.skipped)).inc()
    if not feedback:  # serialised once, for the client and the cache (a hit replaces timings_ms, cached and
        # request_id: above)
        data = body_json(answer)
        if caches.results and not outcome.partial:
            caches.results.put_json(key, data)
        return Response(data, media_type="application/json")
    response = response_model(answer)
    if caches.results and not outcome.partial:  # the answer as computed, before exploration may reorder the reply
        caches.results.put_json(key, to_json(response, exclude={"timings_ms", "cached", "request_id"}))
    # impressions are written by a background thread (sieve/feedback/recorder.py)
    return json_response(feedback.on_search(request_id, body.query, response, outcome, explore))


def rerank_items(body: schemas.RerankRequest) -> list[RerankItem]:
    return [RerankItem(text=d) if isinstance(d, str) else RerankItem(text=d.text, id=d.id) for d in body.documents]


@router.post("/rerank", response_model=schemas.RerankResponse, responses=ERRORS, tags=["search"], dependencies=Guarded)
def rerank(body: schemas.RerankRequest, request: Request, components: ComponentsDep, settings: SettingsDep,
           metrics: MetricsDep):
    """Rerank a candidate list from elsewhere (Cohere / TEI shape). Indexed ids reuse stored vectors."""
    check_limit(len(body.documents), settings.rerank_max_documents, "documents", "SIEVE_RERANK_MAX_DOCUMENTS")
    items, limits = rerank_items(body), limits_of(components, settings)
    outcome = components.searcher.rerank(body.query, items, body.model, body.top_n or len(items),
                                         timeout_of(body, limits), limits.rerank_max_tokens, hang_up(request))
    metrics.observe(outcome.state.timings_ms, outcome.state.counts)
    if outcome.partial:
        metrics.partial.labels(endpoint="/rerank", skipped=",".join(outcome.state.skipped)).inc()
    response = rerank_response(outcome, items, body.model, body.return_documents, uuid.uuid4().hex)
    if request.app.state.feedback:
        request.app.state.feedback.on_rerank(response.request_id, body.query, response, items)
    return json_response(response)  # serialised once by its schema (not validated again and dumped by FastAPI)


WORD = re.compile(r"\S+")


def sieve_model(name: str, searcher) -> str:
    """A stage that ranks texts (ce, cmc, ...) as named; a Cohere model name (`rerank-v3.5`, ...) = the default
    reranker of this server."""
    spec = registry.get(name)
    if spec is not None and spec.rerank is not None:
        return name
    if name.startswith("rerank-"):  # the cross-encoder when the "ce" stage has one, in-process or remote
        return "ce" if searcher.serves_cross_encoder(None, "ce") else "cmc"
    loaded = " | ".join(searcher.runnable())
    raise RequestError(f"model {name!r} is not supported", field="model",
                       allowed=f"{loaded} | a Cohere name rerank-* (the cross-encoder when loaded, else cmc)")


def first_words(text: str, max_words: int | None) -> str:
    """The text up to its max_words-th whitespace-separated word (the text itself when shorter or no limit)."""
    if max_words is None:
        return text
    ends = [m.end() for _, m in zip(range(max_words), WORD.finditer(text))]
    return text[:ends[-1]] if len(ends) == max_words else text


@router.post("/v2/rerank", response_model=schemas.CohereRerankResponse, responses=ERRORS, tags=["search"],
             dependencies=Guarded)
def cohere_rerank(body: schemas.CohereRerankRequest, request: Request, components: ComponentsDep,
                  settings: SettingsDep, metrics: MetricsDep):
    """Cohere's v2 rerank shape (works with `cohere.ClientV2(base_url=...)`), same models and limits as /rerank."""
    check_limit(len(body.documents), settings.rerank_max_documents, "documents", "SIEVE_RERANK_MAX_DOCUMENTS")
    model = sieve_model(body.model, components.searcher)
    items = [RerankItem(text=first_words(d, body.max_tokens_per_doc)) for d in body.documents]
    limits = limits_of(components, settings)
    outcome = components.searcher.rerank(body.query, items, model, body.top_n or len(items),
                                         timeout_of(body, limits), limits.rerank_max_tokens, hang_up(request))
    metrics.observe(outcome.state.timings_ms, outcome.state.counts)
    if outcome.partial:
        metrics.partial.labels(endpoint="/v2/rerank", skipped=",".join(outcome.state.skipped)).inc()
    return json_response(cohere_rerank_response(outcome, len(items)))


@router.get("/healthz", response_model=schemas.Health, tags=["health"])
def healthz():
    """Alive: the process answers."""
    return schemas.Health()


def shows_paths(request: Request) -> bool:
    """Whether this /readyz caller may see the server's file paths: only one with a valid API key (a server without
    keys shows none). /readyz stays open to probes; a wrong key spends its address's bucket as on the guarded routes
    (429 once empty), so /readyz is no way around the rate limit for guessing keys."""
    state, header = request.app.state, request.headers.get("authorization")
    if not state.auth.enabled or not header:
        return False
    try:
        return state.auth.identify(header) is not None
    except Unauthorized:
        state.metrics.rejected.labels(reason="unauthorized").inc()
        limit(state, f"auth-failed:{request.client.host if request.client else 'anonymous'}")
        return False


@router.get("/readyz", response_model=schemas.Ready, responses={503: {"model": schemas.ErrorResponse}}, tags=["health"])
def readyz(request: Request, components: ComponentsDep, settings: SettingsDep):
    """Ready: models and index are loaded, in every worker process; `cmc` says which CMC is served and where it
    came from, `workers` how many processes serve and how that number was chosen. File paths only for a caller with
    a valid API key: anyone else gets the index directory's name and no checkpoint path."""
    index, remote = components.searcher.index, components.searcher.remote_ce
    index.check_ready()  # a Qdrant collection that does not answer: 503 index_unavailable
    team = workers.status(settings)
    if team["ready"] < team["count"]:  # a worker still loading (start-up, or one replaced after it died)
        return error_body(503, "workers_starting", f"{team['ready']} of {team['count']} worker processes are serving",
                          headers={"Retry-After": "1"}, allowed="retry once every worker has loaded its models",
                          workers=team)
    paths = shows_paths(request)
    cmc = request.app.state.cmc.status(index)
    if cmc is not None and not paths:
        cmc = {**cmc, "path": None}
    served = settings.served_index()
    if not paths:
        served["index_dir"] = Path(served["index_dir"].rstrip("/")).name
    return schemas.Ready(index_size=index.size, index_version=index.version, **served,
                         models=components.model_names(), stages=components.stage_names(), device=components.device,
                         remote_cross_encoder=remote.status() if remote else None, precision=components.precision,
                         cmc=cmc, click_memory=request.app.state.memory.status(), workers=team,
                         limits=limits_of(components, settings).as_dict())


@router.get("/metrics", tags=["health"], response_class=Response)
def metrics_endpoint(metrics: MetricsDep, components: ComponentsDep):
    """Prometheus exposition format."""
    metrics.set_index(components.searcher.index)
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
