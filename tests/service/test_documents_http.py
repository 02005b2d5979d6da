"""Live index updates over HTTP: writes are visible to the next search, durable, and never half-applied; reloads
pick up versions written by the CLI; a SIGKILL in the middle of writes loses nothing acknowledged."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server import REPO, Server


@pytest.fixture(scope="module")
def writable(demo_index, tmp_path_factory):
    """One server for this module's tests, on a private copy of the demo index (the tests use distinct ids)."""
    import shutil

    index = tmp_path_factory.mktemp("writable") / "index"
    shutil.copytree(demo_index, index)
    srv = Server({"SIEVE_INDEX_DIR": str(index)}, tmp_path_factory.mktemp("logs") / "writable.log")
    yield srv, index
    srv.stop()


def test_add_replace_delete_are_visible_to_the_next_request(writable):
    server, _ = writable
    with server.client() as client:
        ready = client.get("/readyz").json()
        v0, n0 = ready["index_version"], ready["index_size"]
        doc = {"id": "tea-1", "title": "Green tea", "text": "Green tea leaves are steamed, rolled and dried."}
        added = client.post("/documents", json={"documents": [doc]}).json()
        assert added == {"index_version": v0 + 1, "index_size": n0 + 1, "upserted": 1, "deleted": []}
        top = client.post("/search", json={"query": "steamed green tea leaves", "top_k": 1}).json()
        assert top["results"][0]["id"] == "tea-1" and top["index_version"] == v0 + 1
        client.post("/documents", json={"documents": [{**doc, "text": "Oolong is partly oxidised."}]})
        assert client.get("/documents/tea-1").json()["text"] == "Oolong is partly oxidised."
        gone = client.delete("/documents/tea-1").json()
        assert gone["deleted"] == ["tea-1"] and gone["index_size"] == n0
        assert client.get("/documents/tea-1").status_code == 404
        missing = client.delete("/documents/tea-1")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        metrics = client.get("/metrics").text
        assert f"sieve_index_version {float(gone['index_version'])}" in metrics
        assert re.search(r'^sieve_index_writes_total\{op="upsert"\} [2-9]', metrics, re.M)


def test_bad_writes_are_clear_4xx(writable):
    server, _ = writable
    with server.client() as client:
        dup = client.post("/documents", json={"documents": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]})
        assert dup.status_code == 422 and "unique" in dup.json()["error"]["allowed"]
        assert client.post("/documents", json={"documents": []}).status_code == 422
        assert client.post("/documents", json={"documents": [{"id": "", "text": "x"}]}).status_code == 422
        assert client.post("/documents", json={"documents": [{"id": "b", "text": "x", "path": "/etc"}]}).status_code == 422


def test_concurrent_writes_are_grouped_and_searches_never_fail(writable):
    server, _ = writable
    docs = [{"id": f"batch-{i}", "title": f"Note {i}", "text": f"Observation number {i} about migrating birds."}
            for i in range(24)]
    stop = threading.Event()
    search_status = []

    def searching():
        with server.client() as c:
            while not stop.is_set():
                r = c.post("/search", json={"query": "migrating birds", "top_k": 3})
                search_status.append((r.status_code, r.json().get("index_version")))

    size_before = httpx.get(f"{server.url}/readyz").json()["index_size"]
    reader = threading.Thread(target=searching)
    reader.start()
    with ThreadPoolExecutor(12) as pool:
        acks = list(pool.map(lambda d: httpx.post(f"{server.url}/documents", json={"documents": [d]}, timeout=300), docs))
    stop.set()
    reader.join()
    assert all(a.status_code == 200 for a in acks), [a.text for a in acks if a.status_code != 200]
    versions = {a.json()["index_version"] for a in acks}
    assert len(versions) < len(docs), "concurrent writes should share group commits"
    assert {s for s, _ in search_status} == {200}
    seen = [v for _, v in search_status]
    assert seen == sorted(seen), "a reader saw the index go back a version"
    assert httpx.get(f"{server.url}/readyz").json()["index_size"] == size_before + len(docs)


def test_reload_serves_a_version_written_by_the_cli(writable, tmp_path, cache_dir):
    server, index = writable
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"_id": "cli-1", "title": "Kites", "text": "Box kites fly in steady wind."}) + "\n")
    subprocess.run([sys.executable, "-m", "sieve.cli", "index", "add", "--index", str(index), "--corpus", str(extra)],
                   cwd=REPO, check=True, capture_output=True, env={"SIEVE_CACHE_DIR": str(cache_dir),
                                                                   **__import__("os").environ})
    with server.client() as client:
        assert client.get("/documents/cli-1").status_code == 404  # not served before the reload
        reloaded = client.post("/admin/index/reload").json()
        assert reloaded["changed"] and reloaded["index_version"] == reloaded["previous_version"] + 1
        assert client.get("/documents/cli-1").json()["title"] == "Kites"
        assert not client.post("/admin/index/reload").json()["changed"]


def test_sigkill_during_writes_loses_nothing_acknowledged(index_copy, tmp_path):
    server = Server({"SIEVE_INDEX_DIR": str(index_copy), "SIEVE_WRITE_BATCH_WAIT_MS": "5"}, tmp_path / "a.log")
    acked, lock, stop = [], threading.Lock(), threading.Event()

    def writer(worker: int):
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for i in range(10_000):
                if stop.is_set():
                    return
                doc = {"id": f"w{worker}-{i}", "text": f"worker {worker} note {i}"}
                try:
                    r = c.post("/documents", json={"documents": [doc]})
                except httpx.TransportError:
                    return  # killed mid-request: not acknowledged
                if r.status_code == 200:
                    with lock:
                        acked.append(doc["id"])

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.proc.kill()  # SIGKILL, in the middle of the stream of writes
    server.proc.wait()
    stop.set()
    for t in threads:
        t.join()
    server.log.close()
    assert len(acked) >= 12, "too few writes were acknowledged before the kill"
    restarted = Server({"SIEVE_INDEX_DIR": str(index_copy)}, tmp_path / "b.log")  # loads: the index is whole
    try:
        with restarted.client() as c:
            lost = [i for i in acked if c.get(f"/documents/{i}").status_code != 200]
            assert not lost, f"acknowledged writes lost after SIGKILL: {lost[:10]}"
            assert c.get("/readyz").json()["index_size"] >= 60 + len(acked)
    finally:
        restarted.stop()


def test_each_write_in_a_group_commit_succeeds_or_fails_alone_against_the_newest_version(index_copy, biencoder,
                                                                                        tmp_path):
    """Another writer (a replica, the CLI) changes the index on disk behind this server's loaded version. A group
    holding a valid upsert and a delete of the id that writer removed: the upsert is acknowledged and served, only
    the delete gets 404. A delete of an id that writer added is judged against the newest version and succeeds."""
    from sieve.index import Document, apply_changes

    server = Server({"SIEVE_INDEX_DIR": str(index_copy), "SIEVE_WRITE_BATCH_WAIT_MS": "1500"}, tmp_path / "s.log")
    try:
        with server.client() as client:
            apply_changes(index_copy, [], ["astro-1"], {"primary": biencoder})  # the other writer
            assert client.get("/documents/astro-1").status_code == 200  # still the loaded, older version
            with ThreadPoolExecutor(2) as pool:  # within one 1.5 s group window
                added = pool.submit(client.post, "/documents", json={"documents": [
                    {"id": "group-ok", "text": "Lighthouses guide ships along rocky coasts."}]})
                deleted = pool.submit(client.delete, "/documents/astro-1")
                added, deleted = added.result(), deleted.result()
            assert added.status_code == 200, f"a valid upsert failed for another request's delete: {added.text}"
            assert client.get("/documents/group-ok").status_code == 200
            assert deleted.status_code == 404 and "astro-1" in deleted.json()["error"]["message"], deleted.text

            apply_changes(index_copy, [Document("disk-new", "Kites", "Box kites fly in wind.")], [],
                          {"primary": biencoder})
            gone = client.delete("/documents/disk-new")
            assert gone.status_code == 200, f"a delete judged against an older version than on disk: {gone.text}"
            assert client.get("/documents/disk-new").status_code == 404
            assert client.get("/documents/group-ok").status_code == 200
    finally:
        server.stop()
