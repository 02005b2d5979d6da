"""Protection in front of the work: API keys (Bearer), a per-key token-bucket rate limit (in Redis when configured,
else in this process), a bound on requests in flight, and a request body size limit. Keys are compared in constant
time and never logged: a key is known in logs and Redis only by a short hash."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import threading
import time
from collections import OrderedDict

import pydantic_core
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from sieve.service.errors import error_body, malformed_json
from sieve.service.metrics import Metrics

WORK_PREFIXES = ("/search", "/rerank", "/v2/rerank", "/documents", "/feedback", "/admin")

# Token bucket in one atomic script, on Redis's clock (replicas of Sieve may disagree on theirs).
TOKEN_BUCKET_LUA = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]) or burst, tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return tostring(wait)
"""


class Unauthorized(HTTPException):
    def __init__(self, message: str):
        super().__init__(401, message, headers={"WWW-Authenticate": "Bearer"})


class RateLimited(HTTPException):
    def __init__(self, wait_s: float):
        super().__init__(429, f"rate limit exceeded; retry in {wait_s:.2f} s",
                         headers={"Retry-After": str(max(1, math.ceil(wait_s)))})


def key_id(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


class Authenticator:
    def __init__(self, keys: set[str]):
        self.keys = [k.encode("utf-8") for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def identify(self, authorization: str | None) -> str | None:
        """The caller's key id; None when no keys are configured. Raises Unauthorized."""
        if not self.keys:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("this server requires an API key: send 'Authorization: Bearer <key>'")
        given = token.strip().encode("utf-8")
        if not any(hmac.compare_digest(given, k) for k in self.keys):
            raise Unauthorized("the API key is not valid")
        return key_id(token.strip())


class QueryStringScrub(logging.Filter):
    """On uvicorn's access log: the path without its query string (`?api_key=...` and the like), so a key put in
    a URL never reaches the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].partition("?")[0] + "?[query not logged]", *args[3:])
        return True


def scrub_access_log() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QueryStringScrub) for f in access.filters):
        access.addFilter(QueryStringScrub())


class LocalBuckets:
    """Token buckets per caller in this process (bounded: the oldest idle callers are forgotten)."""

    def __init__(self, rate: float, burst: int, max_callers: int = 100_000, clock=time.monotonic):
        self.rate, self.burst, self.max_callers, self.clock = rate, burst, max_callers, clock
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.lock = threading.Lock()

    def take(self, caller: str) -> float:
        """0 when allowed, else the seconds until a token is there."""
        now = self.clock()
        with self.lock:
            tokens, ts = self.buckets.pop(caller, (self.burst, now))
            tokens = min(self.burst, tokens + (now - ts) * self.rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
            self.buckets[caller] = (tokens - 1 if tokens >= 1 else tokens, now)
            if len(self.buckets) > self.max_callers:
                self.buckets.popitem(last=False)
        return wait


class RateLimiter:
    def __init__(self, rate: float | None, burst: int, redis_store=None, clock=time.monotonic):
        """`clock`: the in-process buckets' time source (a test's own, to step time instead of sleeping)."""
        self.rate, self.burst, self.redis = rate, burst, redis_store
        self.local = LocalBuckets(rate, burst, clock=clock) if rate else None
        self.script = redis_store.client.register_script(TOKEN_BUCKET_LUA) if rate and redis_store else None

    @property
    def remote(self) -> bool:
        """Whether a check calls Redis (a network round trip)."""
        return self.script is not None

    def check(self, caller: str) -> None:
        if not self.rate:
            return
        wait = None
        if self.script is not None:  # Redis down: the local bucket decides, the request is never failed for it
            wait = self.redis.call("ratelimit", lambda: float(self.script(keys=[f"{self.redis.prefix}rl:{caller}"],
                                                                           args=[self.rate, self.burst])))
        if wait is None:
            wait = self.local.take(caller)
        if wait > 0:
            raise RateLimited(wait)


class Admission:
    """Past `limit` work requests in progress, 429 at once instead of queueing. A request counts only once its whole
    body is here: the body must arrive within `body_timeout_s` (else 408 and the connection closed), so clients that
    send a byte and go quiet hold no slot and no connection for long. One per app: InflightLimit and the /search
    fast lane (service/fast_search.py) share its count."""

    def __init__(self, limit: int, metrics: Metrics, body_timeout_s: float = 30.0):
        self.limit, self.metrics, self.body_timeout_s = limit, metrics, body_timeout_s
        self.count = 0

    async def read(self, scope: Scope, receive: Receive, send: Send) -> list[dict] | None:
        """The body's messages, or None when the request was answered here (408, 413, 400 nesting) or its client left."""
        try:
            async with asyncio.timeout(self.body_timeout_s):  # asyncio's own: anyio's fail_after costs more per call
                messages = await read_body(receive)
        except TimeoutError:
            self.metrics.rejected.labels(reason="slow_body").inc()
            response = error_body(408, "body_timeout", f"the request body did not arrive within {self.body_timeout_s:g} s",
                                  allowed="a body sent without pauses (SIEVE_BODY_TIMEOUT_S)", headers={"Connection": "close"})
            await response(scope, receive, send)
            return None
        except BodyTooLarge as exc:
            await error_body(413, "body_too_large", str(exc.detail))(scope, receive, send)
            return None
        if messages[-1]["type"] == "http.disconnect":
            return None  # the client left: nobody to answer
        if nested_too_deeply(messages):
            await malformed_json(f"the request body is nested more than {MAX_NESTING} levels deep")(scope, receive, send)
            return None
        return messages

    async def full(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Whether the limit is reached (then answered 429 here)."""
        if self.count < self.limit:
            return False
        self.metrics.rejected.labels(reason="overloaded").inc()
        response = error_body(429, "overloaded", f"more than {self.limit} requests in progress; retry shortly",
                              allowed="fewer concurrent requests (SIEVE_MAX_INFLIGHT)")
        response.headers["Retry-After"] = "1"
        await response(scope, receive, send)
        return True

    def enter(self) -> None:
        self.count += 1  # one event loop: no lock needed
        self.metrics.inflight.set(self.count)

    def leave(self) -> None:
        self.count -= 1
        self.metrics.inflight.set(self.count)


class InflightLimit:
    """ASGI middleware: the Admission of every work request (read the body, bound the requests in progress), then
    the request runs watched for a hang-up."""

    def __init__(self, app: ASGIApp, admission: Admission):
        self.app, self.admission = app, admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(WORK_PREFIXES):
            return await self.app(scope, receive, send)
        admission = self.admission
        messages = await admission.read(scope, receive, send)
        if messages is None or await admission.full(scope, receive, send):
            return
        admission.enter()
        try:
            await watched(self.app, scope, messages, receive, send)
        finally:
            admission.leave()


async def watched(app: ASGIApp, scope: Scope, body: list[dict], receive: Receive, send: Send) -> None:
    """Runs the request (its `body` messages already read) while listening on the connection: when the client
    hangs up, the threading.Event at scope["state"]["cancelled"] is set (handlers hand it to the pipeline, which
    stops as at a deadline). The app's receive hands out the body, then the disconnect the watcher saw.
    The watcher is a plain asyncio task cancelled when the request ends: an anyio task group's cancel formats the
    repr of the current task on every call, which cost about a sixth of the event loop's time per /search."""
    cancelled, gone = threading.Event(), asyncio.Event()
    scope.setdefault("state", {})["cancelled"] = cancelled

    async def after_body() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    watcher = asyncio.get_running_loop().create_task(watch(receive, cancelled, gone))
    try:
        await app(scope, replay(body, after_body), send)
    finally:
        watcher.cancel()
        if watcher.done() and not watcher.cancelled():
            watcher.exception()  # a receive that failed: the connection is gone, nothing to answer


async def watch(receive: Receive, cancelled: threading.Event, gone: asyncio.Event | None = None) -> None:
    """Sets `cancelled` (and `gone`) once the client hangs up."""
    while (await receive())["type"] != "http.disconnect":
        pass
    cancelled.set()
    if gone is not None:
        gone.set()


async def read_body(receive: Receive) -> list[dict]:
    """Every message of the request body, up to the last one (or a disconnect)."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return messages


MAX_NESTING = 200  # JSON arrays and objects inside each other: pydantic-core's parser stops at this depth


def nested_too_deeply(messages: list[dict]) -> bool:
    """Whether the body nests JSON deeper than MAX_NESTING. Checked here so that the answer (400 malformed_json)
    never depends on the interpreter's recursion limit at the moment json.loads runs (another thread, e.g. a test
    framework, may raise it). Counting brackets is C-fast; only a body with enough of them is parsed to find out."""
    brackets = sum(m.get("body", b"").count(b"[") + m.get("body", b"").count(b"{") for m in messages)
    if brackets <= MAX_NESTING:
        return False
    try:
        pydantic_core.from_json(b"".join(m.get("body", b"") for m in messages))
    except ValueError as exc:
        return "recursion limit" in str(exc)
    return False


def replay(messages: list[dict], receive: Receive) -> Receive:
    """A receive that hands out the body already read, then waits on `receive` (for a disconnect)."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()
    return replayed


def header_bytes(scope: Scope) -> int:
    """Bytes of the request line and headers as they came on the wire (give or take separators)."""
    line = len(scope["method"]) + len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b"")) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"])


class HeaderLimit:
    """ASGI middleware: 400 and the connection closed when the request line and headers pass `limit` bytes. h11's
    own bound (h11_max_incomplete_event_size) only holds while the headers are still incomplete: headers that
    arrive in one read of any size pass it, so the size is checked again here, on every server."""

    def __init__(self, app: ASGIApp, limit: int, metrics: Metrics):
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or header_bytes(scope) <= self.limit:
            return await self.app(scope, receive, send)
        self.metrics.rejected.labels(reason="headers_too_large").inc()
        response = error_body(400, "headers_too_large", f"the request line and headers are larger than this server's "
                              f"limit of {self.limit} bytes", allowed=f"at most {self.limit} bytes (SIEVE_MAX_HEADER_BYTES)",
                              headers={"Connection": "close"})
        await response(scope, receive, send)


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"request body is larger than this server's limit of {limit} bytes")


class BodyLimit:
    """ASGI middleware: 413 when Content-Length or the bytes actually received pass `limit`."""

    def __init__(self, app: ASGIApp, limit: int, metrics: Metrics):
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.limit:
            self.metrics.rejected.labels(reason="too_large").inc()
            message = f"request body is larger than this server's limit of {self.limit} bytes"
            if not length.isdigit():
                message = "the Content-Length header is not a number"
            response = error_body(413 if length.isdigit() else 400, "body_too_large" if length.isdigit()
                                  else "bad_content_length", message, allowed=f"at most {self.limit} bytes (SIEVE_MAX_BODY_BYTES)")
            return await response(scope, receive, send)
        received = 0

        async def counted() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # chunked bodies carry no Content-Length
                self.metrics.rejected.labels(reason="too_large").inc()
                raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)
