"""App factory: the lifespan loads models and index once; handlers only see what it put on app.state."""
from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Callable

import anyio
import torch
from fastapi import FastAPI

from sieve.pipeline import registry
from sieve.service import heap, routes_documents, routes_feedback, workers
from sieve.service.cache import Caches, digest
from sieve.service.cmc_serving import ServedCMC
from sieve.service.components import Components, load_components
from sieve.service.config import Settings
from sieve.service.docs_ui import serve_docs
from sieve.service.errors import install_error_handlers, route_template
from sieve.service.fast_search import FastSearch, SieveAPI
from sieve.service.feedback_service import FeedbackService
from sieve.service.memory_serving import ServedMemory
from sieve.service.metrics import Metrics
from sieve.service.pinning import forward_team, pin_worker, watch_interpreter
from sieve.service.protection import (Admission, Authenticator, BodyLimit, HeaderLimit, InflightLimit, RateLimiter,
                                      scrub_access_log)
from sieve.service.qdrant_service import QdrantUpdater
from sieve.service.routes import router
from sieve.service.runtime import load_index
from sieve.service.updates import IndexUpdater
from sieve.stages.common import model_identity

DESCRIPTION = """Sieve: multi-stage retrieval. By default `POST /search` retrieves with a hybrid of the bi-encoder
(FAISS) and BM25 fused by reciprocal rank, reranks the candidates with CMC (each scored in the context of the
others), and can finish with a cross-encoder on the head (`cross_encoder: true`). `POST /rerank` (and Cohere's
`POST /v2/rerank`) rank candidate lists from elsewhere; `POST /documents` and `DELETE /documents/{id}` change the
live index. Every request has a deadline (`timeout_ms`, else SIEVE_DEFAULT_TIMEOUT_MS): out of time, later stages
are skipped and the answer says so (`partial`, `skipped`). `score` never increases down a list."""
log = logging.getLogger("sieve")


class RequestCounter:
    """ASGI middleware, outermost: counts every request by endpoint and outcome: the status answered, or
    `client_closed` when the client hung up before an answer was started (nobody got a 500; the server did
    nothing wrong). An exception escaping the handlers is answered 500 by the error middleware outside this one."""

    def __init__(self, app, fastapi: FastAPI):
        self.app, self.fastapi = app, fastapi

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status, gone, started = "500", False, time.perf_counter()

        async def receiving() -> dict:
            nonlocal gone
            message = await receive()
            gone = gone or (message["type"] == "http.disconnect" and status == "500")
            return message

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start" and not gone:
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            count_request(self.fastapi, scope, "client_closed" if gone and status == "500" else status, started)


def count_request(fastapi: FastAPI, scope, status: str, started: float, endpoint: str | None = None) -> None:
    # the route template, never the raw URL; a request answered before routing (a mid-body hang-up, a limit)
    # is matched here, so it is counted under the endpoint it was sent to
    endpoint = endpoint or getattr(scope.get("route"), "path", None) or route_template(fastapi, scope) or "unmatched"
    metrics = fastapi.state.metrics
    metrics.child(metrics.requests, endpoint, status).inc()
    metrics.child(metrics.request_latency, endpoint).observe(time.perf_counter() - started)
    if status == "client_closed":
        log.info("client closed the connection before the answer: %s %s", scope["method"], scope["path"])


def fingerprint(components: Components, settings: Settings) -> str:
    """What the answers depend on beyond the request and the index: cached results are only shared between servers
    with the same models, every model a request can pick included (each registered stage's identity)."""
    s = components.searcher
    stages = {}
    for spec in registry.stages():
        model = s.models.get(spec.name)
        stages[spec.name] = None if model is None else (spec.identity or model_identity)(model)
    memory = getattr(getattr(s, "memory", None), "version", None)  # a published click memory changes answers
    return digest(json.dumps([model_identity(s.biencoder), stages, memory, settings.query_max_length,
                              settings.query_overflow,
                              {stage: (c["dtype"], c["runtime"])  # int8, OpenVINO scores differ
                               for stage, c in components.precision.items()}],
                             sort_keys=True, default=str))


def start_services(app: FastAPI, settings: Settings, components: Components) -> None:
    state, metrics, searcher = app.state, app.state.metrics, components.searcher
    state.caches = Caches(settings, metrics)
    state.caches.fingerprint = fingerprint(components, settings)
    searcher.embedding_cache = state.caches.embeddings
    searcher.runners.on_batch = metrics.observe_batch
    searcher.runners.on_thread_start = forward_team  # SIEVE_PIN_INTERPRETER: forwards on the whole share
    searcher.runners.admitted = lambda: state.admission.count  # a batch waits for more only while some may come
    if searcher.remote_ce is not None:  # the "ce" stage on another server: its calls and breaker
        metrics.watch_remote_ce(searcher.remote_ce)
    state.auth = Authenticator(settings.keys())
    scrub_access_log()  # after uvicorn configured its loggers
    state.limiter = RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst, state.caches.redis)
    encoders = {"primary": searcher.biencoder}
    qdrant = settings.on_qdrant
    for name, model in searcher.models.items():  # stores a stage keeps in the index get their vectors for new documents
        store = (registry.get(name).extra.get("index_store") or (lambda _: None))(model)
        if store is not None and (qdrant or searcher.index.has_store(store[0])):
            encoders[store[0]] = store[1]

    def on_swap(index, commit_s):
        metrics.set_index(index)
        if commit_s is not None:
            metrics.index_commit.observe(commit_s)

    state.cmc = serve_cmc(state, settings, components)
    state.memory = ServedMemory(settings, searcher, lambda: setattr(state.caches, "fingerprint",
                                                                     fingerprint(components, settings)))
    state.feedback = FeedbackService(settings) if settings.feedback_enabled else None
    metrics.index_backend_up.set(1.0)  # a local index is always up; a Qdrant one reports every call from here on
    if qdrant:  # writes go straight to Qdrant (service/qdrant_service.py)
        searcher.index.on_call = metrics.observe_index_call
        searcher.index.note("start", searcher.index.meta is not None)  # opened while Qdrant answered, or not
        state.updater = QdrantUpdater(searcher, encoders, lambda index: on_swap(index, None), state.cmc.check,
                                      settings.poll_s())
    else:
        state.updater = IndexUpdater(searcher, settings.index_dir, encoders,
                                     lambda: load_index(settings, searcher.biencoder, torch.device(components.device),
                                                        searcher.cmc),
                                     settings.write_batch_wait_ms, on_swap, settings.poll_s(),
                                     settings.merge_policy(), on_check=lambda: check_beside(state),
                                     catch_up=(settings.workers or 1) > 1)
    metrics.set_index(searcher.index)
    # sync handlers wait on batch futures in the thread pool: it must hold every admitted request
    anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, settings.max_inflight + 8)
    log.info("api keys: %s; rate limit: %s; cache: %s", "on" if state.auth.enabled else "off",
             f"{settings.rate_limit_per_s}/s burst {settings.rate_limit_burst}" if settings.rate_limit_per_s else "off",
             ("redis" if settings.redis_url else "in-process") if settings.cache_enabled else "off")
    if (settings.workers or 1) > 1 and not settings.redis_url and settings.rate_limit_per_s:
        log.warning("rate limit without SIEVE_REDIS_URL is per worker: a caller may get up to %d x %s/s",
                    settings.workers, settings.rate_limit_per_s)


def check_beside(state) -> bool:
    """What lives beside the index versions, on every reload and poll: the click memory, then the adapted CMC (True
    = the CMC changed; a memory that fails to load is logged and the CMC is still checked)."""
    try:
        state.memory.check()
    except Exception:  # noqa: BLE001 - what is served stays; the next check tries again
        log.exception("checking for a new click memory failed")
    return state.cmc.check()


def serve_cmc(state, settings: Settings, components: Components) -> ServedCMC:
    """The served CMC's record; a newly adapted CMC swapped in changes the cache fingerprint and the info metric."""
    def on_swap():
        state.caches.fingerprint = fingerprint(components, settings)
        state.metrics.set_cmc_info(served.info())

    served = ServedCMC(settings, components, on_swap)
    state.metrics.watch_cmc(served)
    return served


def document_optional_auth(app: FastAPI) -> None:
    """Without API keys the Bearer header is optional: say so in the OpenAPI (`{}` in each `security` list), so
    clients and schema fuzzers do not treat a request without it as invalid."""
    build = app.openapi

    def openapi() -> dict:
        schema = build()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                if operation.get("security") and {} not in operation["security"]:
                    operation["security"].append({})
        return schema

    app.openapi = openapi


def create_app(settings: Settings | None = None,
               loader: Callable[[Settings], Components] = load_components, served_process: bool = False) -> FastAPI:
    """`loader` is the seam for tests that need a fake model; production uses load_components. `served_process`: the
    served process's own app (service/heap.py), not a test's."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        pin_worker(settings.pin_workers, settings.workers or 1, workers.metrics_dir(),  # before any model thread starts
                   interpreter=settings.pin_interpreter)
        app.state.components = loader(settings)
        start_services(app, settings, app.state.components)
        # moves the interpreter off a CPU other processes keep busy; from the end of start-up, so that other workers
        # loading their models at the same time (each a few seconds of every CPU) do not count as such
        watch = watch_interpreter()
        pauses = heap.settle(app.state.metrics.gc_pause) if served_process else None
        yield  # one of several worker processes: ready once it listens (supervisor.WorkerServer, /readyz)
        app.state.updater.close()
        if app.state.feedback is not None:
            app.state.feedback.close()
        app.state.components.close()
        if watch is not None:
            watch.stop()
        if pauses is not None:
            pauses.stop()

    # /docs is served offline by serve_docs; ReDoc would load its script and fonts from a CDN, so it is off; routes
    # match exactly (POST /search/ is a JSON 404 naming /search, not a 307 with an empty body)
    app = SieveAPI(title="Sieve", version="0.1.0", description=DESCRIPTION, lifespan=lifespan, docs_url=None,
                  redoc_url=None, redirect_slashes=False)
    serve_docs(app)
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.feedback = None  # FeedbackService once started with SIEVE_FEEDBACK_ENABLED
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(routes_documents.router)
    app.include_router(routes_feedback.router)
    if not settings.keys():
        document_optional_auth(app)
    app.state.admission = Admission(settings.max_inflight, app.state.metrics, settings.body_timeout_s)
    app.add_middleware(InflightLimit, admission=app.state.admission)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, metrics=app.state.metrics)
    app.add_middleware(HeaderLimit, limit=settings.max_header_bytes, metrics=app.state.metrics)
    app.add_middleware(RequestCounter, fastapi=app)  # outermost: counts every answer, the limits' included
    if settings.fast_search:  # POST /search in front of all of the above (service/fast_search.py)
        app.fast_search = FastSearch(app, settings, count_request)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return app


def worker_app():
    """The app of one worker (a uvicorn factory): settings from the environment the supervisor set up."""
    from sieve.service import connections

    settings = Settings()
    # the class uvicorn was handed by name (service/supervisor.py)
    getattr(connections, connections.protocol_name(settings.http_parser)).header_timeout_s = settings.header_timeout_s
    return create_app(settings, served_process=True)
