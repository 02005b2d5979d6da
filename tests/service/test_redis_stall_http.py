"""A stalled Redis (SIGSTOP: connections accepted, nothing answered) for STALL_S under a few clients: not one
/search fails, the server notices (sieve_redis_up 0) and serves without Redis, and uses it again after SIGCONT."""
from __future__ import annotations

import re
import signal
import threading
import time

import httpx

from tests.server import Server

STALL_S, CLIENTS = 5, 3
REQUEST_TIMEOUT_S = 15  # a request that waits on the stalled Redis instead of its 50 ms timeout fails here
QUERIES = ["how do volcanoes erupt", "baking bread", "jazz improvisation", "galaxies and telescopes"]


def redis_up(server: Server) -> float | None:
    found = re.search(r"^sieve_redis_up (\S+)$", httpx.get(f"{server.url}/metrics").text, re.M)
    return float(found.group(1)) if found else None


def wait_for(condition, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        time.sleep(0.1)


class Load:
    """CLIENTS threads sending /search until stopped; counts successes per phase and keeps every failure."""

    def __init__(self, server: Server):
        self.server, self.phase, self.ok, self.failed = server, "before", {}, []
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(w,)) for w in range(CLIENTS)]

    def client(self, worker: int) -> None:
        with httpx.Client(base_url=self.server.url, timeout=REQUEST_TIMEOUT_S) as c:
            i = worker
            while not self.stop.is_set():
                query = QUERIES[i % len(QUERIES)] + ("" if i % 2 else f" {i}")  # cache hits and misses
                try:
                    r = c.post("/search", json={"query": query, "top_k": 5})
                    failure = None if r.status_code == 200 else f"{r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as exc:
                    failure = repr(exc)
                with self.lock:
                    if failure:
                        self.failed.append(failure)
                    else:
                        self.ok[self.phase] = self.ok.get(self.phase, 0) + 1
                i += CLIENTS

    def count(self, phase: str) -> int:
        with self.lock:
            return self.ok.get(phase, 0)


def test_no_search_fails_while_redis_is_stalled(own_redis, demo_index, tmp_path):
    redis_proc, port = own_redis
    server = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
                     "SIEVE_REDIS_TIMEOUT_MS": "50", "SIEVE_REDIS_RETRY_S": "1"}, tmp_path / "server.log")
    load = Load(server)
    try:
        assert redis_up(server) == 1.0
        for t in load.threads:
            t.start()
        wait_for(lambda: load.count("before") >= 10, 60, "10 searches before the stall")
        redis_proc.send_signal(signal.SIGSTOP)
        load.phase, stalled_at = "stalled", time.monotonic()
        try:
            wait_for(lambda: redis_up(server) == 0.0, 30, "the server notices the stalled Redis")
            wait_for(lambda: time.monotonic() - stalled_at >= STALL_S and load.count("stalled") >= 10, 60,
                     f"{STALL_S} s of stall and 10 searches answered during it")
        finally:
            redis_proc.send_signal(signal.SIGCONT)
        load.phase = "after"
        wait_for(lambda: redis_up(server) == 1.0, 30, "the server uses Redis again after SIGCONT")
        wait_for(lambda: load.count("after") >= 10, 60, "10 searches after the stall")
    finally:
        load.stop.set()
        for t in load.threads:
            t.join(timeout=REQUEST_TIMEOUT_S + 5)
        server.stop()
    print(f"\nsearches answered: {load.ok}; failed: {len(load.failed)}")
    assert not load.failed, f"{len(load.failed)} failed searches, e.g. {load.failed[:3]}"
