"""API keys, per-key rate limits, the in-flight bound and the body size limit, against real servers."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server import Server
from tests.service.conftest import API_KEYS, auth, redis_or_skip


def error_code(response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["code"]


def test_keys_are_required_checked_and_never_logged(guarded_server, fresh_key):
    with guarded_server.client() as client:
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


def test_inflight_bound_answers_429_fast_instead_of_queueing(demo_index, tmp_path):
    server = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_MAX_INFLIGHT": "1", "SIEVE_CACHE_ENABLED": "false"},
                    tmp_path / "server.log")
    try:
        slow = {"query": "long work", "documents": [f"text number {i} " * 60 for i in range(80)]}
        held = {}
        holder = threading.Thread(target=lambda: held.update(
            status=httpx.post(f"{server.url}/rerank", json=slow, timeout=600).status_code))
        holder.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and holder.is_alive():  # /metrics is outside the bound: it shows the count
            if "sieve_inflight_requests 1.0" in httpx.get(f"{server.url}/metrics", timeout=60).text:
                break
            time.sleep(0.05)
        response = httpx.post(f"{server.url}/search", json={"query": "x"}, timeout=300)
        still_working = holder.is_alive()  # answered while the work in progress went on: not queued behind it
        holder.join()
        assert held.get("status") == 200, "the slow request itself should have been served"
        assert still_working, "the slow request ended before the probe: the machine was too fast for this test's setup"
        assert response.status_code == 429, response.text
        assert response.json()["error"]["code"] == "overloaded" and response.headers["retry-after"] == "1"
        assert httpx.post(f"{server.url}/search", json={"query": "x"}, timeout=60).status_code == 200
    finally:
        server.stop()
