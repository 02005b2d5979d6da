"""`sieve serve` with two worker processes on one port and one index directory (service/workers.py), as a real
subprocess, pinned (SIEVE_PIN_WORKERS): each runs on its own CPU (no CUDA MPS daemon on a CPU), a burst of new connections reaches both, a write
through one worker is read through the other, a published click memory reaches both, /metrics adds up both, a
SIGKILLed worker is replaced (on the CPU it had) without losing an acknowledged write, SIGHUP replaces both while
every request is answered (each new worker pinned once the old one lets go of its CPU), and SIGTERM lets both finish what they have in flight
and leaves no semaphore behind.
The tests share one server and run in file order; the SIGTERM test ends it."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import threading
import time

import httpx
import pytest

from sieve.index import SearchIndex
from sieve.service import workers
from tests.server import Server
from tests.service.test_heap import frozen_counts, gc_pause_count

WORKERS = 2
REPLACED_WITHIN_S = 600  # a new worker loads the bi-encoder: seconds on a quiet machine, minutes on a busy one


@pytest.fixture(scope="module")
def team(demo_index, tmp_path_factory):
    index = tmp_path_factory.mktemp("workers") / "index"
    shutil.copytree(demo_index, index)
    srv = Server({"SIEVE_INDEX_DIR": str(index), "SIEVE_WORKERS": str(WORKERS), "SIEVE_WRITE_BATCH_WAIT_MS": "5",
                  "SIEVE_FEEDBACK_ENABLED": "true", "SIEVE_PIN_WORKERS": "true"},
                 tmp_path_factory.mktemp("logs") / "workers.log")
    srv.index = index
    yield srv
    srv.stop()


def worker_of(client: httpx.Client) -> int:
    """The pid of the worker this client's connection reached (the body of a 503 names it too)."""
    body = client.get("/readyz").json()
    return (body.get("workers") or body["error"]["workers"])["pid"]


def client_on_another_worker(server: Server, pid: int) -> tuple[httpx.Client, int]:
    """A new keep-alive connection that reached a worker other than `pid`, and that worker's pid (one /readyz asked).
    Each worker listens on a socket of its own (SO_REUSEPORT) and the kernel picks one from the connection's
    addresses, so each new connection (a new source port) reaches the other worker with probability 1/2."""
    for _ in range(64):
        client = server.client()
        other = worker_of(client)
        if other != pid:
            return client, other
        client.close()
    raise AssertionError(f"64 new connections in a row reached worker {pid}: connections are not spread")


def clients_on_two_workers(server: Server) -> tuple[httpx.Client, httpx.Client]:
    """Two keep-alive clients whose connections reached different workers."""
    first = server.client()
    second, _ = client_on_another_worker(server, worker_of(first))
    return first, second


def metric(text: str, name: str, **labels) -> float:
    """The value of one series of a /metrics exposition (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "") + r" (\S+)"
    found = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def cpus_of(client: httpx.Client) -> list[int]:
    body = client.get("/readyz").json()
    return (body.get("workers") or body["error"]["workers"])["cpus"]


def test_each_pinned_worker_runs_on_its_own_cpus(team):
    """SIEVE_PIN_WORKERS: the two workers split the CPUs the server may use (one each on a 2-core machine)."""
    allowed = sorted(os.sched_getaffinity(0))
    a, b = clients_on_two_workers(team)
    try:
        first, second = cpus_of(a), cpus_of(b)
    finally:
        a.close()
        b.close()
    assert len(allowed) >= WORKERS  # the machines this runs on have 2 cores or more
    assert sorted(first + second) == allowed and not set(first) & set(second)


def test_a_burst_of_new_connections_is_spread_over_both_workers(team):
    """Connections opened at once, as a client's keep-alive pool opens them, reach both workers: each worker listens
    on a socket of its own and the kernel spreads connections by address (all 24 on one worker: p = 2^-23). With one
    shared socket the worker that woke first could accept the whole burst and keep it (Settings.reuse_port)."""
    socks = [socket.create_connection(("127.0.0.1", team.port), timeout=60) for _ in range(24)]
    try:
        for sock in socks:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: sieve\r\nConnection: close\r\n\r\n")
        pids = []
        for sock in socks:
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
            body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            pids.append((body.get("workers") or body["error"]["workers"])["pid"])
    finally:
        for sock in socks:
            sock.close()
    assert len(set(pids)) == WORKERS, pids


def test_on_a_cpu_the_supervisor_starts_no_mps_daemon(team):
    """CUDA MPS (SIEVE_CUDA_MPS=auto, service/mps.py) is for several workers on one GPU: on a CPU nothing is started
    nor warned about, and every worker says so."""
    a, b = clients_on_two_workers(team)
    try:
        reports = [(c.get("/readyz").json().get("workers") or {}).get("mps") for c in (a, b)]
    finally:
        a.close()
        b.close()
    assert reports == [{"state": "not cuda", "pipe_directory": None,
                        "reason": "the workers run on the cpu: nothing to share"}] * 2
    log = team.log_path.read_text()
    assert "CUDA MPS" not in log and "time-slice" not in log


def test_every_worker_froze_its_start_up_objects(team):
    """Each worker's full garbage collections skip what its start-up made (service/heap.py): one freeze per worker
    started, after its models and index were loaded."""
    team.wait_ready(120)
    counts = frozen_counts(team.log_path.read_text())
    assert len(counts) >= WORKERS and all(n > 50_000 for n in counts), counts
    deadline = time.monotonic() + 30  # each worker's start-up collection, timed, summed over the workers
    with team.client() as client:
        while gc_pause_count(client.get("/metrics").text, 2) < WORKERS:
            assert time.monotonic() < deadline, "the workers' generation-2 pauses are not all on /metrics"
            time.sleep(0.5)


def test_a_write_through_one_worker_is_read_through_the_other(team):
    a, b = clients_on_two_workers(team)
    try:
        writer = worker_of(a)
        doc = {"id": "team-1", "text": "quokkas photograph themselves smiling on Rottnest Island"}
        assert a.post("/documents", json={"documents": [doc]}).status_code == 200
        reader = worker_of(b)
        got = b.get("/documents/team-1")
        hits = b.post("/search", json={"query": "quokkas Rottnest", "top_k": 3, "retriever": "bm25"}).json()
        assert worker_of(b) == reader and worker_of(a) == writer and reader != writer
    finally:
        a.close()
        b.close()
    assert got.status_code == 200 and got.json()["text"] == doc["text"]
    assert hits["results"][0]["id"] == "team-1"


def test_a_click_sent_to_another_worker_is_checked_against_what_the_first_showed(team):
    a, b = clients_on_two_workers(team)
    try:
        answer = a.post("/search", json={"query": "how do volcanoes erupt", "top_k": 3}).json()
        shown, rid = [r["id"] for r in answer["results"]], answer["request_id"]
        ok = b.post("/feedback", json={"events": [{"request_id": rid, "doc_id": shown[1]}]})
        assert ok.status_code == 200 and ok.json()["accepted"] == 1, ok.text
        not_shown = b.post("/feedback", json={"events": [{"request_id": rid, "doc_id": "not-shown-anywhere"}]})
        assert not_shown.status_code == 422 and not_shown.json()["error"]["code"] == "document_not_shown"
        assert worker_of(a) != worker_of(b)
    finally:
        a.close()
        b.close()


def test_a_published_click_memory_reaches_every_worker(team):
    """`sieve feedback learn` publishes into the index's click store; no reload is sent (one would reach one worker):
    each worker looks on its own (Settings.poll_s: every 2 s with several workers) and both serve the memory."""
    from sieve.feedback.memory import ClickMemory
    from sieve.feedback.memory_store import MemoryStore

    query = "how do volcanoes erupt"
    a, b = clients_on_two_workers(team)
    try:
        body = {"query": query, "top_k": 5, "retriever": "bm25"}
        lowest = a.post("/search", json=body, headers={"Cache-Control": "no-cache"}).json()["results"][-1]["id"]
        memory = ClickMemory(1.0, 0.0, 5.0, 0.1, {ClickMemory.key_of(query): {lowest: 3.0}}, {})
        store = MemoryStore(team.index)
        work = store.new_work_dir()
        memory.save(work)
        published = store.publish(work).name
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            served = [(c.get("/readyz").json().get("click_memory") or {}).get("version") for c in (a, b)]
            if served == [published, published]:
                break
            time.sleep(0.2)
        assert served == [published, published]
        for c in (a, b):
            top = c.post("/search", json=body, headers={"Cache-Control": "no-cache"}).json()["results"]
            assert top[0]["id"] == lowest and "clicks" in top[0]["scores"]
        assert worker_of(a) != worker_of(b)
    finally:
        a.close()
        b.close()


def test_counters_and_histograms_add_up_every_worker(team):
    with team.client() as c:
        before = c.get("/metrics").text
    calls, pids = 0, set()
    for _ in range(20):
        with team.client() as c:  # a new connection each time: the kernel spreads them, mostly over both workers
            pids.add(worker_of(c))
        calls += 1
    if len(pids) < WORKERS:  # all 20 reached one: one more, on the other
        c, pid = client_on_another_worker(team, next(iter(pids)))
        c.close()
        pids.add(pid)
        calls += 1
    with team.client() as c:
        after = c.get("/metrics").text
    series = {"endpoint": "/readyz", "status": "200"}
    assert metric(after, "sieve_requests_total", **series) - metric(before, "sieve_requests_total", **series) == calls
    count = "sieve_request_latency_seconds_count"
    assert metric(after, count, endpoint="/readyz") - metric(before, count, endpoint="/readyz") == calls
    assert metric(after, "sieve_index_size") > 0 and 'sieve_cmc_info{' in after


class Writes:
    """Single-document writes from a few threads, each on a new connection; what was acknowledged (200)."""

    def __init__(self, server: Server):
        self.server, self.acked, self.lock = server, [], threading.Lock()

    def run(self, writer: int, n: int) -> None:
        for i in range(n):
            doc = {"id": f"kill-{writer}-{i}", "text": f"note {i} of writer {writer} about lighthouses"}
            try:
                with self.server.client(timeout=60) as c:
                    r = c.post("/documents", json={"documents": [doc]})
            except httpx.TransportError:
                continue  # its worker was killed: not acknowledged
            if r.status_code == 200:
                with self.lock:
                    self.acked.append(doc["id"])


def test_a_killed_worker_is_replaced_and_no_acknowledged_write_is_lost(team):
    victim, survivor = sorted(live_workers(team))
    victim_cpus = sorted(os.sched_getaffinity(victim))
    writes = Writes(team)
    threads = [threading.Thread(target=writes.run, args=(w, 15)) for w in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(writes.acked) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(victim, signal.SIGKILL)
    while workers.alive(victim):  # SIGKILL is delivered at once: wait for the exit (a zombie is not alive)
        time.sleep(0.01)
    # dead, reaped by the supervisor or not: no longer counted as serving (asked on new connections, each tried again
    # when the kernel resets it, as a connection that met the victim's socket closing is: on_a_new_connection)
    assert on_a_new_connection(team, "GET", "/readyz").status_code == 503
    for t in threads:
        t.join(timeout=300)
    assert len(writes.acked) >= 6
    missing = [i for i in writes.acked if on_a_new_connection(team, "GET", f"/documents/{i}").status_code != 200]
    assert not missing, f"acknowledged, then not served by the surviving worker: {missing[:5]}"
    replaced = wait_for_replacement(team, victim, survivor)
    c, pid = client_on_another_worker(team, survivor)  # the replacement answers too, and has every write
    try:
        assert pid == replaced != victim
        assert cpus_of(c) == victim_cpus  # the replacement took the slot the victim's death freed
        missing = [i for i in writes.acked if c.get(f"/documents/{i}").status_code != 200]
    finally:
        c.close()
    assert not missing, f"acknowledged, then not served by the replacement: {missing[:5]}"


def fresh_get(server: Server, path: str) -> httpx.Response:
    with server.client() as c:
        return c.get(path)


def live_workers(server: Server) -> set[int]:
    """The pids of both workers: one connection left to the kernel, one made to reach the other."""
    with server.client() as c:
        first = worker_of(c)
    c, second = client_on_another_worker(server, first)
    c.close()
    return {first, second}


def wait_for_replacement(server: Server, victim: int, survivor: int) -> int:
    """Waits until /readyz is 200 again (every worker serving); returns the pid of the new worker."""
    deadline = time.monotonic() + REPLACED_WITHIN_S
    while time.monotonic() < deadline:
        with server.client() as c:
            r = c.get("/readyz")
        if r.status_code == 200:
            break
        time.sleep(0.5)
    assert r.status_code == 200, r.text
    seen = live_workers(server)
    assert victim not in seen and survivor in seen, (victim, survivor, seen)
    return next(iter(seen - {survivor}))


RESET = (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)


def on_a_new_connection(server: Server, method: str, path: str, **kwargs) -> httpx.Response:
    """One request on a new connection. A connection the kernel queued on a worker's socket as that worker stopped
    is reset before anything is read (the host's net.ipv4.tcp_migrate_req = 0, as here, does not move it to
    another worker): a client tries again, as this does (3 tries)."""
    for attempt in range(3):
        try:
            with server.client() as c:
                return c.request(method, path, **kwargs)
        except RESET:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def pids_seen(server: Server, connections: int = 24) -> set[int]:
    """The workers that answered `connections` new connections (each reaches one by its address: all of 2 workers
    are seen unless 24 connections all reach one, p = 2^-23)."""
    seen = set()
    for _ in range(connections):
        body = on_a_new_connection(server, "GET", "/readyz").json()
        seen.add((body.get("workers") or body["error"]["workers"])["pid"])
    return seen


def test_sighup_replaces_every_worker_one_by_one_and_every_request_is_answered(team):
    """uvicorn's rolling restart on SIGHUP: each new worker serves before the one it replaces stops. Searches on
    new connections all the while: every one is answered 200 (a stopping worker closes its socket before it
    drains what it accepted; a connection reset before it was read is tried again, as a client would)."""
    before = pids_seen(team)
    team.proc.send_signal(signal.SIGHUP)
    answers, deadline, now = [], time.monotonic() + REPLACED_WITHIN_S, before
    while time.monotonic() < deadline:
        answers.append(on_a_new_connection(team, "POST", "/search",
                                           json={"query": "lighthouse keepers", "top_k": 3}).status_code)
        now = pids_seen(team, 8)
        if not now & before and len(pids_seen(team)) == WORKERS:
            break
    assert not now & before, (before, now)
    assert set(answers) == {200}, answers
    assert on_a_new_connection(team, "GET", "/readyz").status_code == 200
    placed, deadline = {}, time.monotonic() + 60  # each new worker started with both slots held: it pins itself
    while time.monotonic() < deadline:             # once the worker it replaced lets go of its slot (pin_later)
        placed = {}
        for _ in range(24):
            body = on_a_new_connection(team, "GET", "/readyz").json()
            placed[body["workers"]["pid"]] = tuple(body["workers"]["cpus"])
        if len(placed) == WORKERS and all(len(c) == 1 for c in placed.values()) and len(set(placed.values())) == 2:
            break
        time.sleep(0.5)
    assert len(set(placed.values())) == WORKERS and all(len(c) == 1 for c in placed.values()), placed


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc)."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:  # gone meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # "pid (name) state ppid ..."
            out.append(int(entry))
    return out


def cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_sigterm_lets_every_worker_finish_its_writes_then_exits(team):
    a, b = clients_on_two_workers(team)
    batches = {name: [{"id": f"drain-{name}-{i}", "text": f"a long note {i} " + "about tides and moons " * 12}
                      for i in range(150)] for name in "ab"}
    answers = {}

    def post(name, client):
        try:
            answers[name] = client.post("/documents", json={"documents": batches[name]}, timeout=300)
        finally:
            client.close()

    threads = [threading.Thread(target=post, args=pair) for pair in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    deadline, inflight = time.monotonic() + 60, 0.0
    while inflight < 2 and time.monotonic() < deadline:  # both writes are in, on their two workers
        inflight = metric(fresh_get(team, "/metrics").text, "sieve_inflight_requests")
    trackers = [pid for pid in children(team.proc.pid) if "resource_tracker" in cmdline(pid)]
    team.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=300)
    assert team.proc.wait(timeout=300) == 0
    deadline = time.monotonic() + 60  # multiprocessing's resource tracker reports what was left once it sees the end
    while any(workers.alive(pid) and "resource_tracker" in cmdline(pid) for pid in trackers) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    team.log.flush()
    assert "leaked semaphore" not in team.log_path.read_text()  # each worker's progress-bar lock (supervisor.py)
    assert inflight >= 2, "the two writes were not both in flight at SIGTERM"
    assert {name: r.status_code for name, r in answers.items()} == {"a": 200, "b": 200}
    with SearchIndex.load(team.index) as index:
        assert all(index.has_id(d["id"]) for docs in batches.values() for d in docs)
