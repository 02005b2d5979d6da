"""POST /search, /rerank and /v2/rerank without the per-request machinery of FastAPI and the middleware stack
(SIEVE_FAST_SEARCH, on by default): about a third of the event loop's work per /search on 2 shared cores
(docs/benchmarks.md); for a /rerank, the body's `json.loads` and its validation from Python objects besides.

SieveAPI (the app create_app returns) hands POST /search, /rerank and /v2/rerank (`LANES`) to FastSearch before
anything else runs. FastSearch does, in one coroutine, what the stack does for an ordinary request to those routes:
the header and body size limits (it takes only a request with a Content-Length within SIEVE_MAX_BODY_BYTES, headers
within SIEVE_MAX_HEADER_BYTES and an application/json body), the body read within SIEVE_BODY_TIMEOUT_S and the
in-flight bound (the app's one Admission, service/protection.py), the hang-up watcher, validation of the route's
schema straight from the bytes (`model_validate_json`: schemas.SearchRequest, RerankRequest, CohereRerankRequest),
the guard (API key, rate limit), the same handler (routes.search, routes.rerank, routes.cohere_rerank) in a worker
thread, the app's own error handlers for what that raises (a 500 as the error middleware answers it), and the request
counted under its route as RequestCounter counts it.

Everything else goes through the full stack untouched, the body replayed when it was read: other routes and methods,
a request outside the limits, another content type, and every body this lane does not accept as valid, so each
400/422 is FastAPI's own answer. The routes stay declared in FastAPI (the OpenAPI schema and /docs do not change).
tests/service/test_fast_search.py sends the same requests both ways, to each route."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Callable

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from sieve.service import routes
from sieve.service.protection import header_bytes, replay, watch
from sieve.service.schemas import CohereRerankRequest, RerankRequest, SearchRequest

JSON_TYPES = (b"application/json", b"application/json; charset=utf-8", b"application/json;charset=utf-8")


@dataclass(frozen=True)
class Lane:
    """One route the lean lane answers: its body's schema (validated from the bytes) and its handler's call."""
    endpoint: str
    validate: Callable[[bytes], BaseModel]
    handle: Callable  # (body, request, components, app state) -> the handler's answer, in a worker thread


LANES = {lane.endpoint: lane for lane in (
    Lane("/search", SearchRequest.model_validate_json, lambda body, request, components, state: routes.search(
        body, request, components, state.settings, state.metrics, state.caches)),
    Lane("/rerank", RerankRequest.model_validate_json, lambda body, request, components, state: routes.rerank(
        body, request, components, state.settings, state.metrics)),
    Lane("/v2/rerank", CohereRerankRequest.model_validate_json,
         lambda body, request, components, state: routes.cohere_rerank(
             body, request, components, state.settings, state.metrics)),
)}


class SieveAPI(FastAPI):
    """FastAPI, with POST /search, /rerank and /v2/rerank answered by `fast_search` when set (SIEVE_FAST_SEARCH)."""
    fast_search: "FastSearch | None" = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.fast_search
        if fast is not None and scope["type"] == "http" and scope["method"] == "POST" and not self.root_path:
            lane = LANES.get(scope["path"])
            if lane is not None:
                scope["app"] = self
                return await fast(scope, receive, send, lane)
        await super().__call__(scope, receive, send)


class FastSearch:
    def __init__(self, app: SieveAPI, settings, count):
        """`count(app, scope, status, started, endpoint)`: RequestCounter's counting (service/app.py)."""
        self.fastapi, self.count = app, count
        self.max_header_bytes, self.max_body_bytes = settings.max_header_bytes, settings.max_body_bytes
        # the handler's thread: a plain executor is a cheaper hop than anyio's (no capacity limiter, no task group);
        # it holds every request the Admission lets in, as the anyio pool does (app.py)
        self.pool = ThreadPoolExecutor(max(40, settings.max_inflight + 8), thread_name_prefix="search")
        self.answered = 0  # requests this lane answered itself (tests check that it is taken)

    def full_stack(self, scope: Scope, receive: Receive, send: Send):
        return FastAPI.__call__(self.fastapi, scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, lane: Lane) -> None:
        started = time.perf_counter()
        length = content_type = authorization = None
        lengths = 0
        for name, value in scope["headers"]:
            if name == b"content-length":
                length, lengths = value, lengths + 1
            elif name == b"content-type" and content_type is None:
                content_type = value
            elif name == b"authorization" and authorization is None:
                authorization = value
        if lengths != 1 or not length.isdigit() or int(length) > self.max_body_bytes or content_type is None \
                or content_type.lower() not in JSON_TYPES or header_bytes(scope) > self.max_header_bytes:
            return await self.full_stack(scope, receive, send)
        state = self.fastapi.state
        admission, status = state.admission, None

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start" and status is None:
                status = "client_closed" if cancelled.is_set() else str(message["status"])
            await send(message)

        cancelled = threading.Event()
        messages = await admission.read(scope, receive, sending)  # 408, 400 (nesting) answered there
        if messages is None:
            return self.count(self.fastapi, scope, status or "client_closed", started, lane.endpoint)
        try:
            body = lane.validate(b"".join(m.get("body", b"") for m in messages))
        except (ValidationError, ValueError):  # FastAPI answers it, in its own words
            return await self.full_stack(scope, replay(messages, receive), send)
        self.answered += 1
        try:
            if await admission.full(scope, receive, sending):
                return
            admission.enter()
            scope.setdefault("state", {})["cancelled"] = cancelled
            watcher = asyncio.get_running_loop().create_task(watch(receive, cancelled))
            try:
                await self.answer(lane, body, authorization, scope, receive, sending)
            finally:
                admission.leave()
                watcher.cancel()
                if watcher.done() and not watcher.cancelled():
                    watcher.exception()  # a receive that failed: the connection is gone, nothing to answer
        finally:
            self.count(self.fastapi, scope, status or "500", started, lane.endpoint)

    async def answer(self, lane: Lane, body: BaseModel, authorization: bytes | None, scope: Scope, receive: Receive,
                     send: Send) -> None:
        request, state = Request(scope, receive), self.fastapi.state
        try:
            header = authorization.decode("latin-1") if authorization is not None else None
            address = scope["client"][0] if scope.get("client") else "anonymous"
            if state.limiter.remote:
                await self.in_thread(routes.check_caller, state, header, address)
            else:
                routes.check_caller(state, header, address)
            components = await routes.get_components(request)
            response = await self.in_thread(lane.handle, body, request, components, state)
        except Exception as exc:
            handler = self.handler(exc)
            if handler is not None:
                response = await handler(request, exc)
            else:  # as Starlette's error middleware: the 500 answer, then the exception on to the server's log
                await (await self.fastapi.exception_handlers[Exception](request, exc))(scope, receive, send)
                raise
        await response(scope, receive, send)

    async def in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, partial(fn, *args))

    def handler(self, exc: Exception):
        """The app's handler for this exception (service/errors.py), as Starlette's ExceptionMiddleware finds it;
        None for the catch-all Exception (a 500)."""
        handlers = self.fastapi.exception_handlers
        for kind in type(exc).__mro__:
            if kind is Exception:
                return None
            if kind in handlers:
                return handlers[kind]
        return None
