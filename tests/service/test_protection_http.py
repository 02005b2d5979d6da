"""API keys, per-key rate limits, the in-flight bound and the body size limit, against real servers."""
from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server import Server
from tests.service.conftest import API_KEYS, auth, redis_or_skip


def error_code(response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["code"]


def test_keys_are_required_checked_and_never_logged(guarded_server, fresh_key, fresh_address):
    with guarded_server.client(local_address=fresh_address()) as client:  # its failed keys spend no one else's bucket
        assert error_code(client.post("/search", json={"query": "x"}), 401) == "unauthorized"
        wrong = client.post("/search", json={"query": "x"}, headers=auth("not-a-key"))
        assert error_code(wrong, 401) == "unauthorized" and wrong.headers["www-authenticate"] == "Bearer"
        assert error_code(client.post("/search", json={"query": "x"}, headers={"Authorization": "Basic abc"}), 401)
        for key in (fresh_key("env"), fresh_key("file")):  # one from SIEVE_API_KEYS, one from SIEVE_API_KEYS_FILE
            assert client.post("/search", json={"query": "bread"}, headers=auth(key)).status_code == 200
        assert error_code(client.post("/admin/index/reload"), 401) == "unauthorized"
        assert client.get("/healthz").status_code == 200 and client.get("/metrics").status_code == 200  # probes open
        assert 'sieve_rejected_total{reason="unauthorized"}' in client.get("/metrics").text
    log = guarded_server.log_path.read_text()
    assert not any(key in log for key in API_KEYS), "an API key reached the log"


def test_rate_limit_answers_429_with_retry_after_and_refills(guarded_server, redis_prefix, fresh_key):
    """40 requests at once against a bucket of 5 refilled at 5/s: never more than the bucket allows get through."""
    redis = redis_or_skip()
    key = auth(fresh_key())  # a key no other test spent: its bucket starts full
    with guarded_server.client() as client:
        started = time.monotonic()
        with ThreadPoolExecutor(40) as pool:
            responses = list(pool.map(lambda _: client.get("/documents/astro-1", headers=key), range(40)))
        elapsed = time.monotonic() - started
        ok = [r for r in responses if r.status_code == 200]
        limited = [r for r in responses if r.status_code == 429]
        assert len(ok) + len(limited) == 40, [r.status_code for r in responses]
        assert len(ok) <= 5 + 5 * elapsed + 1, f"{len(ok)} passed in {elapsed:.1f} s through a 5/s bucket of 5"
        assert limited, f"no 429 although 40 requests came in {elapsed:.1f} s"
        assert limited[0].json()["error"]["code"] == "rate_limited" and int(limited[0].headers["retry-after"]) >= 1
        assert client.get("/documents/astro-1", headers=auth(fresh_key())).status_code == 200  # other keys unaffected
        time.sleep(1.2)
        assert client.get("/documents/astro-1", headers=key).status_code == 200  # refilled
    assert list(redis.scan_iter(match=f"{redis_prefix}rl:*")), "the buckets live in Redis when it is configured"


def test_wrong_keys_are_rate_limited_per_client_address(guarded_server, fresh_key, fresh_address):
    """40 guesses at once from one address: past the bucket (5, refilled at 5/s) they get 429, not another try."""
    guesser = fresh_address()
    with guarded_server.client(local_address=guesser) as client:
        started = time.monotonic()
        with ThreadPoolExecutor(40) as pool:
            responses = list(pool.map(lambda i: client.get("/documents/astro-1", headers=auth(f"guess-{i}")), range(40)))
        elapsed = time.monotonic() - started
        refused = [r for r in responses if r.status_code == 401]
        limited = [r for r in responses if r.status_code == 429]
        assert len(refused) + len(limited) == 40, [r.status_code for r in responses]
        assert len(refused) <= 5 + 5 * elapsed + 1, f"{len(refused)} guesses answered in {elapsed:.1f} s"
        assert limited and limited[0].json()["error"]["code"] == "rate_limited", "wrong keys are not rate limited"
        assert client.get("/documents/astro-1", headers=auth(fresh_key())).status_code == 200  # a real key still works
    with guarded_server.client(local_address=fresh_address()) as other:  # the bucket is the guessing address's
        assert error_code(other.get("/documents/astro-1", headers=auth("guess-x")), 401) == "unauthorized"


def test_a_key_in_the_query_string_never_reaches_the_access_log(guarded_server, fresh_key):
    secret, key = fresh_key(), auth(fresh_key())
    with guarded_server.client() as client:
        assert client.get(f"/documents/astro-1?api_key={secret}", headers=key).status_code == 200
        assert error_code(client.post(f"/search?api_key={secret}&x=1", json={"query": "x"}), 401) == "unauthorized"
    log = guarded_server.log_path.read_text()
    assert '"GET /documents/astro-1?[query not logged] HTTP/1.1" 200' in log, "the access log lost the request"
    # the whole line as uvicorn words it, from the lean formatter (service/access_log.py)
    assert re.search(r'^INFO: {5}127\.0\.0\.1:\d+ - "GET /documents/astro-1\?\[query not logged\] HTTP/1\.1" 200 OK$',
                     log, re.MULTILINE), log[-2000:]
    assert secret not in log, "a key sent in the query string reached the log"


def test_headers_past_the_limit_are_refused_and_the_server_goes_on(guarded_server, fresh_key):
    """SIEVE_MAX_HEADER_BYTES (64 KiB): a 1 MB header is refused (400, or the connection closed while it is still
    being sent), never served; an 8 KB header is served. The limit binds headers that arrive in more than one read;
    one read (up to 256 KiB) is held anyway."""
    key = auth(fresh_key())
    with guarded_server.client() as client:
        try:
            status = client.get("/documents/astro-1", headers={**key, "X-Padding": "a" * 1_000_000}).status_code
        except httpx.TransportError:
            status = "closed"
        assert status in (400, "closed"), f"a 1 MB header was answered {status}"
        assert client.get("/documents/astro-1", headers={**key, "X-Padding": "a" * 8_000}).status_code == 200


def test_body_size_limit(guarded_server, fresh_key):
    key = auth(fresh_key())
    with guarded_server.client() as client:
        big = {"documents": [{"id": f"d{i}", "text": "x" * 1000} for i in range(100)]}  # ~110 KB > 64 KiB
        assert error_code(client.post("/documents", json=big, headers=key), 413) == "body_too_large"

        def chunks():  # no Content-Length: the limit counts the bytes as they arrive
            yield b'{"query": "'
            for _ in range(100):
                yield b"a" * 1000
            yield b'"}'
        chunked = client.post("/search", content=chunks(), headers={**key, "content-type": "application/json"})
        assert error_code(chunked, 413) == "body_too_large"
        assert client.get("/healthz").status_code == 200


def test_slow_bodies_hold_no_inflight_slot_and_are_cut_off(demo_index, tmp_path):
    """Four connections send headers and one byte of a 100-byte body, then go quiet, against 2 in-flight slots:
    other requests are still served, nothing counts as in flight, and each slow one gets 408 once
    SIEVE_BODY_TIMEOUT_S (2 s) has passed, on a connection the server then closes. A fifth sends half its headers:
    the server closes it after SIEVE_HEADER_TIMEOUT_S (2 s)."""
    import socket

    server = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_MAX_INFLIGHT": "2", "SIEVE_BODY_TIMEOUT_S": "2",
                     "SIEVE_HEADER_TIMEOUT_S": "2"}, tmp_path / "server.log")
    slow = []
    try:
        trickle = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        slow_headers = trickle.makefile("rb")
        trickle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line that ends them
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            slow.append(sock)
        with server.client() as client:
            for _ in range(3):  # more requests than slots, one after another
                answer = client.post("/search", json={"query": "volcanoes", "top_k": 2})
                assert answer.status_code == 200, answer.text
            assert "sieve_inflight_requests 0.0" in client.get("/metrics").text
        for sock in slow:
            reply = b""
            while chunk := sock.recv(65536):  # until the server closes the connection
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 408") and b"body_timeout" in reply, reply[:300]
        assert slow_headers.read() == b"", "unfinished headers got an answer"  # read() returns once it is closed
        trickle.close()
    finally:
        for sock in slow:
            sock.close()
        server.stop()


def test_inflight_bound_answers_429_fast_instead_of_queueing(index_copy, tmp_path):
    """The slot is held by a write waiting out its 5 s group-commit window (SIEVE_WRITE_BATCH_WAIT_MS): a hold
    the server's own timer makes long, not a model the machine might finish before the probe arrives."""
    server = Server({"SIEVE_INDEX_DIR": str(index_copy), "SIEVE_MAX_INFLIGHT": "1", "SIEVE_CACHE_ENABLED": "false",
                     "SIEVE_WRITE_BATCH_WAIT_MS": "5000"}, tmp_path / "server.log")
    try:
        write = {"documents": [{"id": "held-1", "text": "A write that waits for company."}]}
        held = {}
        holder = threading.Thread(target=lambda: held.update(
            status=httpx.post(f"{server.url}/documents", json=write, timeout=600).status_code))
        holder.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and holder.is_alive():  # /metrics is outside the bound: it shows the count
            if "sieve_inflight_requests 1.0" in httpx.get(f"{server.url}/metrics", timeout=60).text:
                break
            time.sleep(0.05)
        response = httpx.post(f"{server.url}/search", json={"query": "x"}, timeout=300)
        still_working = holder.is_alive()  # answered while the work in progress went on: not queued behind it
        holder.join()
        assert held.get("status") == 200, "the held write itself should have been served"
        assert still_working, "the held write ended before the probe was answered"
        assert response.status_code == 429, response.text
        assert response.json()["error"]["code"] == "overloaded" and response.headers["retry-after"] == "1"
        assert httpx.post(f"{server.url}/search", json={"query": "x"}, timeout=60).status_code == 200
    finally:
        server.stop()
