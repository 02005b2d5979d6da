"""Maps every failure a client can cause to a 4xx JSON body; anything else is logged and answered 500 without a
traceback in the body."""
from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from sieve.index import IndexDiskFullError, IndexMismatchError, UnknownDocumentError
from sieve.index.errors import IndexUnavailableError
from sieve.pipeline.errors import EncoderTimeout, RequestError
from sieve.service.updates import WritePending

log = logging.getLogger("sieve")


def error_body(status: int, code: str, message: str, headers: dict | None = None, **extra) -> JSONResponse:
    info = {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}
    return JSONResponse(status_code=status, content={"error": info}, headers=headers)


MALFORMED = "a JSON object as described at /docs"
# why json.loads failed where it raises something other than a JSONDecodeError (FastAPI answers those 400
# "There was an error parsing the body"): the bytes are not UTF-8, the nesting passes the parser's recursion limit,
# or an integer passes Python's digit limit
PARSE_FAILURES = ((UnicodeDecodeError, "the request body is not UTF-8 text"),
                  (RecursionError, "the request body is nested too deeply"),
                  (ValueError, "the request body holds a number too long to read"))


def malformed_json(message: str = "the request body is not valid JSON") -> JSONResponse:
    return error_body(400, "malformed_json", message, field="body", allowed=MALFORMED)


FIELD_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")  # every request field is snake_case
TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}  # pydantic's names of union members


def field_path(loc) -> str:
    """`documents.0.text` from pydantic's location: "body" and the tags pydantic adds for the member of a union
    (`function-after[...]`, `RerankDocument`, `str`) are left out."""
    parts = [str(p) for p in loc if isinstance(p, int) or (p != "body" and FIELD_NAME.match(p) and p not in TYPE_TAGS)]
    return ".".join(parts)


def describe(error: dict) -> dict:
    field = field_path(error.get("loc", ()))
    return {"field": field or None, "message": error.get("msg", "invalid"), "type": error.get("type")}


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return malformed_json()
    content_type = request.headers.get("content-type", "")
    if "json" not in content_type.lower() and any(tuple(e.get("loc", ())) == ("body",) for e in errors):
        return error_body(422, "not_json", f"the body was sent as {content_type or 'no content type'}, so it was "
                          "not read as JSON", field="body",
                          allowed="a JSON object sent with the header Content-Type: application/json")
    details = [describe(e) for e in errors]
    summary = "; ".join(f"{d['field']}: {d['message']}" if d["field"] else d["message"] for d in details)
    # `field` at the top level too (the first field at fault; `details` has one entry per problem)
    field = next((d["field"] for d in details if d["field"]), "body")
    return error_body(422, "validation_error", summary, field=field, details=details,
                      allowed="see the request schema at /docs")


async def on_request_error(request: Request, exc: RequestError) -> JSONResponse:
    return error_body(exc.status_code, exc.code, exc.message, field=exc.field, allowed=exc.allowed)


async def on_unknown_documents(request: Request, exc: UnknownDocumentError) -> JSONResponse:
    message = exc.args[0] if exc.args else "unknown document ids"
    if request.url.path.startswith("/documents"):  # a resource path: the document is not there
        return error_body(404, "not_found", str(message), allowed="the id of an indexed document")
    return error_body(422, "unknown_document_ids", str(message), field="documents",
                      allowed="ids of indexed documents, or give the text")


async def on_disk_full(request: Request, exc: IndexDiskFullError) -> JSONResponse:
    return error_body(507, "insufficient_storage", exc.strerror or "no space left on the index filesystem",
                      allowed="retry once the index filesystem has space; nothing of this write was applied")


async def on_index_unavailable(request: Request, exc: IndexUnavailableError) -> JSONResponse:
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    return error_body(503, "index_unavailable", str(exc), headers={"Retry-After": "1"},
                      allowed="retry once the index (Qdrant) answers again; a write that got this answer was not "
                              "acknowledged")


async def on_encoder_timeout(request: Request, exc: EncoderTimeout) -> JSONResponse:
    """A query vector that never came (pipeline/searcher.py `encoded`): the server is overloaded or a batcher is
    stuck; the request is answered instead of holding its thread. A client that hung up is logged at info, not as an
    error: nothing is wrong with the server (a load generator ending its run closes connections mid-request)."""
    log.log(logging.INFO if exc.client_gone else logging.ERROR, "%s %s: %s", request.method, request.url.path, exc)
    return error_body(503, "encoder_timeout", str(exc), headers={"Retry-After": "1"},
                      allowed="retry; the server could not encode the query in twice the request's timeout")


async def on_write_pending(request: Request, exc: WritePending) -> JSONResponse:
    """A write not applied within SIEVE_WRITE_TIMEOUT_S (or whose client hung up): not acknowledged, still queued."""
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    return error_body(503, "write_pending", str(exc), headers={"Retry-After": "5"},
                      allowed="send the same write again later (safe: an upsert replaces by id, a delete already "
                              "applied answers 404); nothing was acknowledged")


async def on_index_mismatch(request: Request, exc: IndexMismatchError) -> JSONResponse:
    """The index (a Qdrant collection rebuilt under a running server) was built by another model than the one served:
    the server cannot answer from it until one of them changes, which is not the client's doing."""
    log.error("%s %s: %s", request.method, request.url.path, exc)
    return error_body(503, "index_mismatch", str(exc),
                      allowed="the operator rebuilds the index with this server's model, or serves the model the index "
                              "was built with; a write that got this answer was not acknowledged")


HTTP_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 409: "conflict",
              413: "body_too_large", 429: "rate_limited"}


def parse_failure(exc: StarletteHTTPException) -> str | None:
    """What was wrong with a body json.loads could not read, when that is why FastAPI raised this 400."""
    if exc.status_code != 400:
        return None
    return next((message for kind, message in PARSE_FAILURES if isinstance(exc.__cause__, kind)), None)


def leaf_routes(routes) -> list:
    """Every route with a path, an included router's too (newer FastAPI keeps an included router as one entry
    holding its routes under `original_router`; Sieve includes its routers without a prefix)."""
    out = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        out.extend(leaf_routes(inner.routes) if inner is not None else [route])
    return out


def route_template(app, scope) -> str | None:
    """The path template (`/documents/{doc_id}`) of the route this request's path names, whatever its method; None
    when no route does. For requests answered before routing (a hang-up mid-body, a limit): their endpoint label."""
    partial = None
    for route in leaf_routes(app.router.routes):
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return getattr(route, "path", None)
        if match is Match.PARTIAL and partial is None:  # the path matches, the method does not
            partial = getattr(route, "path", None)
    return partial


def route_without_slash(request: Request) -> str | None:
    """`/search` when `/search/` was asked for: routes are matched exactly (no 307 redirect, which would answer an
    empty body and make clients send the POST body twice)."""
    path = request.url.path.rstrip("/")
    if path == request.url.path or not path:
        return None
    return route_template(request.app, {**request.scope, "path": path})


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if (message := parse_failure(exc)) is not None:
        return malformed_json(message)
    if exc.status_code == 404 and (path := route_without_slash(request)) is not None:
        return error_body(404, "not_found", f"no route {request.url.path}", allowed=f"{path} (without the slash)")
    return error_body(exc.status_code, HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail),
                      headers=getattr(exc, "headers", None))


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_body(500, "internal_error", "the server failed to answer; the error is in its log")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(UnknownDocumentError, on_unknown_documents)
    app.add_exception_handler(IndexDiskFullError, on_disk_full)
    app.add_exception_handler(IndexUnavailableError, on_index_unavailable)
    app.add_exception_handler(IndexMismatchError, on_index_mismatch)
    app.add_exception_handler(EncoderTimeout, on_encoder_timeout)
    app.add_exception_handler(WritePending, on_write_pending)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
