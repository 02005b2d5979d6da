"""20 s of loopback load at 16 clients while our own Redis (not the machine's) is killed halfway: not one request
fails; the server counts the Redis errors and goes on uncached. The 10 s after the kill span five of the server's
2 s reconnection attempts."""
from __future__ import annotations

import re
import threading
import time

import httpx

from tests.server import Server

DURATION_S, CLIENTS = 20, 16
QUERIES = ["how do volcanoes erupt", "baking bread", "jazz improvisation", "galaxies and telescopes", "roman roads",
           "database transactions", "protein folding", "bicycle gears"]


def test_no_request_fails_when_redis_dies_under_load(own_redis, demo_index, tmp_path):
    redis_proc, port = own_redis
    server = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
                     "SIEVE_REDIS_TIMEOUT_MS": "50", "SIEVE_REDIS_RETRY_S": "2"}, tmp_path / "server.log")
    results, lock = {"ok_before": 0, "ok_after": 0, "failed": []}, threading.Lock()
    killed = threading.Event()
    end = time.monotonic() + DURATION_S

    def client(worker: int):
        with httpx.Client(base_url=server.url, timeout=120) as c:
            i = worker
            while time.monotonic() < end:
                query = QUERIES[i % len(QUERIES)] + ("" if i % 3 else f" {i}")  # repeats (cache hits) and fresh ones
                phase = "ok_after" if killed.is_set() else "ok_before"
                try:
                    r = c.post("/search", json={"query": query, "top_k": 5})
                    failure = None if r.status_code == 200 else f"{r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as exc:
                    failure = repr(exc)
                with lock:
                    if failure:
                        results["failed"].append(failure)
                    else:
                        results[phase] += 1
                i += CLIENTS

    try:
        threads = [threading.Thread(target=client, args=(w,)) for w in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(DURATION_S / 2)
        redis_proc.kill()  # Redis stopped halfway
        redis_proc.wait()
        killed.set()
        for t in threads:
            t.join()
        metrics = httpx.get(f"{server.url}/metrics").text
    finally:
        server.stop()
    assert not results["failed"], f"{len(results['failed'])} failed requests, e.g. {results['failed'][:3]}"
    assert results["ok_before"] > 0 and results["ok_after"] > 0, results
    errors = sum(float(v) for v in re.findall(r'^sieve_cache_errors_total\{op="\w+"\} (\S+)$', metrics, re.M))
    assert errors > 0 and "sieve_redis_up 0.0" in metrics
    hits = re.search(r'^sieve_cache_requests_total\{cache="result",outcome="hit"\} (\S+)$', metrics, re.M)
    assert hits and float(hits.group(1)) > 0, "the cache served hits while Redis was up"
