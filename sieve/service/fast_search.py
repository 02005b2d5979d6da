"""POST /search without FastAPI's per-request machinery (SIEVE_FAST_SEARCH, on by default).

An ASGI middleware, innermost: the limits (headers, body, in-flight, hang-up watcher) have run and the body has been
read. It takes a body that is valid JSON for schemas.SearchRequest, sent as application/json, and does what
FastAPI's route would: the guard (API key, rate limit), the same handler (routes.search) in a worker thread, the
handlers' error answers for what that raises. Validation is pydantic's, straight from the bytes
(`model_validate_json`, no json.loads and dict in between) and routing is one comparison, so what FastAPI spends per
request (route matching, body parsing, dependency resolution, its exception and exit-stack wrappers) is not spent.

Anything else goes to FastAPI untouched, the body replayed: other routes and methods, another content type, and every
body this path does not accept, so each 400/422 is FastAPI's own answer. The route stays declared in FastAPI (the
OpenAPI schema and /docs do not change). tests/service/test_fast_search.py sends the same bodies both ways."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from sieve.service import routes
from sieve.service.errors import leaf_routes
from sieve.service.protection import replay
from sieve.service.schemas import SearchRequest

JSON_TYPES = (b"application/json", b"application/json; charset=utf-8", b"application/json;charset=utf-8")
validate = SearchRequest.model_validate_json


class FastSearch:
    def __init__(self, app: ASGIApp, fastapi, threads: int):
        self.app, self.fastapi = app, fastapi
        self.route = next(r for r in leaf_routes(fastapi.router.routes)
                          if getattr(r, "path", None) == "/search" and "POST" in getattr(r, "methods", ()))
        # the handler's thread: a plain executor is a cheaper hop than anyio's (no capacity limiter, no task group);
        # `threads` holds every request InflightLimit admits, as the anyio pool does (app.py)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="search")
        self.answered = 0  # requests this path answered itself (tests check it is taken)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/search" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        messages, body = [], b""
        while True:  # the body InflightLimit read, handed out again (or the hang-up)
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        headers = scope["headers"]
        content_type = authorization = None
        for name, value in headers:
            if name == b"content-type" and content_type is None:
                content_type = value
            elif name == b"authorization" and authorization is None:
                authorization = value
        if messages[-1]["type"] != "http.request" or content_type is None or content_type.lower() not in JSON_TYPES:
            return await self.app(scope, replay(messages, receive), send)
        try:
            search = validate(body)
        except (ValidationError, ValueError):  # FastAPI answers it, in its own words
            return await self.app(scope, replay(messages, receive), send)
        scope["route"], scope["endpoint"] = self.route, self.route.endpoint  # for RequestCounter's label
        self.answered += 1
        request = Request(scope, receive)
        state = self.fastapi.state
        try:
            header = authorization.decode("latin-1") if authorization is not None else None
            address = scope["client"][0] if scope.get("client") else "anonymous"
            if state.limiter.remote:
                await self.in_thread(routes.check_caller, state, header, address)
            else:
                routes.check_caller(state, header, address)
            components = await routes.get_components(request)
            response = await self.in_thread(routes.search, search, request, components, state.settings,
                                            state.metrics, state.caches)
        except Exception as exc:
            handler = self.handler(exc)
            if handler is None:
                raise  # a 500, answered by the error middleware outside, as for FastAPI's route
            response = await handler(request, exc)
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

