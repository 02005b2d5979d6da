"""benchmarks/gpu.py's raw client reads what a server answers as it is: status codes, a partial answer, a closed or
dropped connection (a scripted asyncio server here, no Sieve)."""
from __future__ import annotations

import asyncio
import json

from benchmarks.gpu import RawClient, raw_closed_loop

REPLIES = [
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 16\r\n\r\n{"partial":true}',
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\nConnection: close\r\n\r\n{\"partial\":false}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",  # then the server hangs up mid-body
]


async def scripted(replies: list[bytes], bodies: list[bytes]):
    """A server that answers the n-th request (over every connection) with replies[n] and records each body."""
    count = 0

    async def handle(reader, writer):
        nonlocal count
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                bodies.append(await reader.readexactly(length))
                reply = replies[min(count, len(replies) - 1)]
                count += 1
                writer.write(reply)
                await writer.drain()
                if b"Connection: close" in reply or b"Content-Length: 100" in reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_the_raw_client_counts_each_answer_by_what_it_was():
    async def run():
        bodies = []
        server = await scripted(REPLIES, bodies)
        port = server.sockets[0].getsockname()[1]
        client = RawClient(f"http://127.0.0.1:{port}/search")
        got = [await client.post(json.dumps({"query": f"q{i}"}).encode(), timeout=5) for i in range(len(REPLIES))]
        client.close()
        server.close()
        return got, bodies

    got, bodies = asyncio.run(run())
    assert got == ["200-partial", "429", "200", "no-content-length", "IncompleteReadError"]
    assert [json.loads(b)["query"] for b in bodies] == [f"q{i}" for i in range(len(REPLIES))]


def test_the_closed_loop_sends_each_client_its_own_bodies_until_time_is_up():
    async def run():
        bodies = []
        server = await scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"], bodies)
        port = server.sockets[0].getsockname()[1]
        lat, codes = [], {}
        await raw_closed_loop(f"http://127.0.0.1:{port}/search", lambda j: {"j": j}, range(3), 0.3, lat, codes)
        server.close()
        return bodies, lat, codes

    bodies, lat, codes = asyncio.run(run())
    assert codes == {"200": len(lat)} and len(lat) == len(bodies) > 3
    sent = {json.loads(b)["j"] for b in bodies}
    assert {0, 37, 74} <= sent  # client i starts at body i * 37
