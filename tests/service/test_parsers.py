"""Both HTTP parsers (SIEVE_HTTP_PARSER: httptools, the default, and h11) keep the same protections: a JSON 400
`headers_too_large` (counted) for a request line and headers still arriving past the limit, a JSON 400
`malformed_request` for what the parser cannot read, the connection closed when headers do not arrive in time; and
ordinary traffic (keep-alive, a big body after a finished request, HEAD, an empty answer) is answered whole. A tiny
ASGI app in uvicorn in a thread: no models."""
from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from sieve.service.connections import bounded_protocol
from tests.server import free_port

LIMIT = 8192


async def echo(scope, receive, send) -> None:
    """Answers the body's length; an empty 204 for DELETE."""
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"" if scope["method"] == "DELETE" else str(size).encode()
    await send({"type": "http.response.start", "status": 204 if scope["method"] == "DELETE" else 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


@pytest.fixture(scope="module", params=["httptools", "h11"])
def served(request):
    rejected: list[str] = []
    protocol = bounded_protocol(1.0, rejected.append, request.param)
    server = uvicorn.Server(uvicorn.Config(echo, host="127.0.0.1", port=free_port(), log_level="warning",
                                           http=protocol, h11_max_incomplete_event_size=LIMIT, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield server.config.port, rejected, request.param
    server.should_exit = True
    thread.join(30)


def exchange(port: int, pieces: list[bytes]) -> bytes:
    """Sends the pieces, then reads until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        for piece in pieces:
            sock.sendall(piece)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


def test_headers_still_arriving_past_the_limit_are_json_and_counted(served):
    port, rejected, _ = served
    before = rejected.count("headers_too_large")
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(f"x-pad-{i}: {'x' * 1000}\r\n".encode() for i in range(20))
    reply = exchange(port, [head])  # never the blank line that ends the headers
    assert reply.startswith(b"HTTP/1.1 400") and b"application/json" in reply.lower(), reply[:300]
    assert b'"code": "headers_too_large"' in reply and rejected.count("headers_too_large") == before + 1


def test_what_the_parser_cannot_read_is_json_malformed_request(served):
    port, _, _ = served
    reply = exchange(port, [b"GET / HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n"])
    assert reply.startswith(b"HTTP/1.1 400") and b'"code": "malformed_request"' in reply, reply[:300]


def test_headers_that_do_not_arrive_in_time_close_the_connection(served):
    port, _, _ = served
    assert exchange(port, [b"GET / HTTP/1.1\r\nHost: x\r\n"]) == b""  # header deadline 1 s: closed, no answer


def test_keep_alive_traffic_is_answered_whole(served):
    """A small request, then on the same connection a body larger than the header limit arriving in the same read
    as its head (not a head past the limit), a HEAD, an empty 204, and a last request that closes."""
    port, rejected, _ = served
    before = len(rejected)
    big = b"y" * (4 * LIMIT)
    pieces = [b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab"
              + b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(big) + big,
              b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n", b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n",
              b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"]
    reply = exchange(port, pieces)
    answers = reply.split(b"HTTP/1.1 ")[1:]
    assert [a[:3] for a in answers] == [b"200", b"200", b"200", b"204", b"200"], reply[:600]
    assert answers[0].endswith(b"\r\n\r\n2") and answers[1].endswith(b"\r\n\r\n%d" % len(big))
    assert answers[2].endswith(b"\r\n\r\n") and answers[4].endswith(b"\r\n\r\n3")
    assert len(rejected) == before
