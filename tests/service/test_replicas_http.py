"""Two replicas on one index directory: both take writes at once (the writer lock in index/layout.py orders them,
SIEVE_INDEX_POLL_S makes each reload the other's versions), one is SIGKILLed in the middle of its writes. Every
acknowledged document must be served by the survivor within the poll interval and by both after the restart."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server import Server

POLL_S = 0.2
VISIBLE_WITHIN_S = POLL_S + 10  # the poll interval plus a margin for a loaded 2-core machine
WRITERS, DOCS_EACH = 2, 15


def replica(index_dir, log_path) -> Server:
    return Server({"SIEVE_INDEX_DIR": str(index_dir), "SIEVE_INDEX_POLL_S": str(POLL_S),
                   "SIEVE_WRITE_BATCH_WAIT_MS": "5"}, log_path)


class Writes:
    """POST /documents one document at a time from a few threads; remembers what was acknowledged (200)."""

    def __init__(self):
        self.acked: dict[str, list[str]] = {}
        self.failed: list[str] = []
        self.lock = threading.Lock()

    def run(self, server: Server, name: str, worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for i in range(DOCS_EACH):
                doc = {"id": f"{name}{worker}-{i}", "text": f"replica {name} worker {worker} note {i}"}
                try:
                    r = client.post("/documents", json={"documents": [doc]})
                except httpx.TransportError:
                    return  # the server was killed mid-request: not acknowledged
                with self.lock:
                    if r.status_code == 200:
                        self.acked.setdefault(name, []).append(doc["id"])
                    else:
                        self.failed.append(f"{doc['id']}: {r.status_code} {r.text[:200]}")

    def count(self, name: str) -> int:
        with self.lock:
            return len(self.acked.get(name, []))

    def all(self) -> list[str]:
        return [i for ids in self.acked.values() for i in ids]


def missing_on(server: Server, ids: list[str], within_s: float) -> list[str]:
    """Ids the server still does not serve after polling for `within_s` seconds."""
    deadline, missing = time.monotonic() + within_s, list(ids)
    with server.client(timeout=30) as client:
        while missing and time.monotonic() < deadline:
            missing = [i for i in missing if client.get(f"/documents/{i}").status_code != 200]
            if missing:
                time.sleep(POLL_S / 2)
    return missing


def test_two_replicas_writing_then_one_sigkilled_lose_no_acknowledged_document(index_copy, tmp_path):
    with ThreadPoolExecutor(2) as pool:  # the two start at once: each start loads the models
        a_start, b_start = (pool.submit(replica, index_copy, tmp_path / f"{n}.log") for n in "ab")
        a, b = a_start.result(), b_start.result()
    restarted = None
    writes = Writes()
    try:
        threads = [threading.Thread(target=writes.run, args=(srv, name, w))
                   for srv, name in ((a, "a"), (b, "b")) for w in range(WRITERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while writes.count("a") < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        a.proc.kill()  # SIGKILL replica a in the middle of its writers' stream
        a.proc.wait()
        for t in threads:
            t.join(timeout=120)
        acked = writes.all()
        print(f"\nfailed writes: {len(writes.failed)} {writes.failed[:3]}")
        assert not writes.failed, writes.failed[:5]
        assert writes.count("a") >= 5 and writes.count("a") < WRITERS * DOCS_EACH, "a was not killed mid-write"
        assert writes.count("b") == WRITERS * DOCS_EACH

        lost_on_b = missing_on(b, acked, VISIBLE_WITHIN_S)
        restarted = replica(index_copy, tmp_path / "a2.log")
        lost_on_a = missing_on(restarted, acked, VISIBLE_WITHIN_S)
        print(f"\nacknowledged {len(acked)} (a {writes.count('a')}, b {writes.count('b')}); "
              f"visible on b {len(acked) - len(lost_on_b)}, on restarted a {len(acked) - len(lost_on_a)}; "
              f"lost {len(set(lost_on_b) | set(lost_on_a))}")
        assert not lost_on_b, f"acknowledged documents not served by the surviving replica: {lost_on_b[:10]}"
        assert not lost_on_a, f"acknowledged documents not served by the restarted replica: {lost_on_a[:10]}"
        with b.client() as cb, restarted.client() as ca:
            assert cb.get("/readyz").json()["index_size"] == ca.get("/readyz").json()["index_size"]
    finally:
        for srv in (a, b, restarted):
            if srv is not None:
                srv.stop()
