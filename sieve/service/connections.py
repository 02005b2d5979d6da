"""uvicorn's HTTP protocols with a deadline for every request's line and headers: a connection that has not sent
them within `header_timeout_s` of opening (or of its previous response) is closed, so clients that trickle headers
(slowloris) cannot hold connections open. uvicorn itself only times out idle keep-alive connections.

A request the parser cannot read is answered in the API's JSON error shape, not uvicorn's plain text: headers still
arriving past SIEVE_MAX_HEADER_BYTES (uvicorn's h11_max_incomplete_event_size) are 400 `headers_too_large`, counted
in sieve_rejected_total like the ones the HeaderLimit middleware refuses; anything else the parser refuses is 400
`malformed_request`. Both close the connection.

Two parsers: httptools (uvicorn's C parser, llhttp: the default, `BoundedHttpToolsProtocol`) and h11 (pure Python,
`BoundedH11Protocol`, where httptools is not installed). httptools has no bound of its own on the size of the
request line and headers, so this protocol counts the bytes that arrive while they are incomplete."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - uvicorn[standard] installs it on every platform Sieve runs on
    httptools = HttpToolsProtocol = None


LINGER_S = 2.0  # the most a refused connection is kept reading (and dropping) what its client still sends


def rejection(code: str, message: str, allowed: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "allowed": allowed}}).encode()


class Bounded:
    """What both protocols add to uvicorn's: the header deadline, the JSON 400s and a lingering close."""
    header_timeout_s: float = 10.0
    on_rejected: Callable[[str], None] = staticmethod(lambda reason: None)  # counts a rejection by its reason
    lingering = False

    def refusal(self, too_large: bool) -> bytes:
        """The 400 answer (status line, headers, JSON body) to a request whose line and headers cannot be read."""
        limit = self.config.h11_max_incomplete_event_size
        if too_large:
            self.on_rejected("headers_too_large")
            body = rejection("headers_too_large", f"the request line and headers are larger than this server's "
                             f"limit of {limit} bytes", f"at most {limit} bytes (SIEVE_MAX_HEADER_BYTES)")
        else:
            body = rejection("malformed_request", "the request line or headers are not valid HTTP/1.1",
                             "a well-formed HTTP/1.1 request")
        return body

    def linger(self) -> None:
        """Lingering close, as nginx does: stop writing, then read and drop what the client still sends for up to
        LINGER_S before closing. Closing at once with its headers still arriving would reset the connection, and
        the client's TCP stack could drop the answer it had not read yet."""
        self.lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def start_connection(self) -> None:
        # uvicorn builds every access-log line's arguments (client address, quoted path) before the logger drops it;
        # below INFO (SIEVE_LOG_LEVEL=warning) no line is written, so none is built (about 2% of the event loop's time)
        self.access_log = self.access_log and self.access_logger.isEnabledFor(logging.INFO)
        self.header_timer: asyncio.TimerHandle | None = None
        self.arm_header_timer()

    def arm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        self.header_timer = self.loop.call_later(self.header_timeout_s, self.on_header_timeout)

    def disarm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def on_header_timeout(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def body_still_arriving(self) -> bool:
        """Whether the current request's body is still being received (each parser knows it its own way)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """On SIGTERM: a connection still sending its request body is closed at once (its request has not started:
        nobody is owed an answer; uvicorn would wait for it until SIEVE_BODY_TIMEOUT_S). Idle connections are closed
        and requests whose body is in are answered, as uvicorn does."""
        if self.cycle is not None and not self.cycle.response_complete and self.body_still_arriving():
            self.transport.close()
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm_header_timer()
        super().connection_lost(exc)


class OneWrite:
    """The transport of one request/response cycle as uvicorn's httptools cycle sees it: the response's status line
    and headers are held until its first body bytes, and both go out in one write (one send() to the socket
    instead of two: on loopback each costs the receiver's side of TCP too). Held bytes are written on anything
    else the cycle does with the transport (close, any other call). uvicorn writes every body message, an empty one
    too, so the head never waits past the first; a HEAD answer has no body message and is not held."""
    __slots__ = ("transport", "cycle", "held")

    def __init__(self, transport: asyncio.Transport, cycle):
        self.transport, self.cycle, self.held = transport, cycle, None

    def write(self, data: bytes) -> None:
        cycle = self.cycle
        if self.held is None and cycle.response_started and not cycle.response_complete \
                and cycle.scope["method"] != "HEAD" and data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n"):
            self.held = data  # the head, written by the cycle just after it marked the response started
            return
        if self.held is not None:
            data, self.held = self.held + data, None
        self.transport.write(data)

    def flush(self) -> None:
        if self.held is not None:
            data, self.held = self.held, None
            self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str):
        self.flush()
        return getattr(self.transport, name)


class BoundedHttpToolsProtocol(Bounded, HttpToolsProtocol or object):
    """httptools (C) parses; the bytes of a request line and headers still incomplete are counted here, since the
    parser would buffer any size."""
    head_pending = True  # between the end of one request (or the connection's start) and the end of the next's headers
    head_bytes = 0
    requests_read = 0  # requests whose body has been read to the end on this connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.start_connection()

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # after an answer that closes the connection: dropped
            return
        requests_before = self.requests_read
        super().data_received(data)
        if self.head_pending and not self.lingering:
            # a request that ended in this read: the next one's head is some tail of it, not counted (at most one read
            # of bytes goes uncounted; h11's own bound is as coarse)
            self.head_bytes += len(data) if self.requests_read == requests_before else 0
            limit = self.config.h11_max_incomplete_event_size
            if limit is not None and self.head_bytes > limit:
                self.refuse(too_large=True)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request httptools cannot read, as JSON."""
        self.refuse(too_large=False)

    def refuse(self, too_large: bool) -> None:
        body = self.refusal(too_large)
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.disarm_header_timer()
        self.linger()

    def on_headers_complete(self) -> None:
        self.head_pending, self.head_bytes = False, 0
        self.disarm_header_timer()  # a request's headers are in: the body has SIEVE_BODY_TIMEOUT_S
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.transport is self.transport:
            self.cycle.transport = OneWrite(self.transport, self.cycle)

    def on_message_complete(self) -> None:
        self.head_pending, self.requests_read = True, self.requests_read + 1
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.arm_header_timer()  # the next request on this connection gets the same time for its headers

    def body_still_arriving(self) -> bool:
        return self.cycle.more_body


class BoundedH11Protocol(Bounded, H11Protocol):
    """h11 (pure Python) parses and bounds the incomplete request line and headers itself."""

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot read, as JSON (the headers could not be read: nothing of the
        request reached the app or its middleware)."""
        limit = self.config.h11_max_incomplete_event_size
        body = self.refusal(limit is not None and len(self.conn.trailing_data[0]) > limit)
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]
        for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.linger()

    def data_received(self, data: bytes) -> None:
        if not self.lingering:  # after an answer that closes the connection: dropped
            super().data_received(data)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.start_connection()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.arm_header_timer()  # the next request on this connection gets the same time for its headers

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete and self.header_timer is not None:
            self.disarm_header_timer()  # a request's headers are in: the body has SIEVE_BODY_TIMEOUT_S

    def body_still_arriving(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY


# the protocol uvicorn is handed by name (the supervisor's workers): httptools where installed
BoundedProtocol = BoundedHttpToolsProtocol if HttpToolsProtocol is not None else BoundedH11Protocol


def bounded_protocol(header_timeout_s: float, on_rejected: Callable[[str], None] | None = None,
                     parser: str = "httptools") -> type[Bounded]:
    """The protocol class to hand uvicorn (`http=`), with this server's header deadline; `on_rejected(reason)`
    counts the requests it refuses itself (the app's Metrics.rejected). `parser`: httptools (h11 when httptools
    is not installed) or h11."""
    base = BoundedH11Protocol if parser == "h11" or HttpToolsProtocol is None else BoundedHttpToolsProtocol
    extra = {"on_rejected": staticmethod(on_rejected)} if on_rejected is not None else {}
    return type(base.__name__, (base,), {"header_timeout_s": header_timeout_s, **extra})


def protocol_name(parser: str) -> str:
    """The name in this module of the protocol for `parser` (SIEVE_HTTP_PARSER), for uvicorn's workers."""
    return "BoundedH11Protocol" if parser == "h11" or HttpToolsProtocol is None else "BoundedProtocol"


def bounded_h11(header_timeout_s: float, on_rejected: Callable[[str], None] | None = None) -> type[Bounded]:
    return bounded_protocol(header_timeout_s, on_rejected, parser="h11")
