"""A write request waits for its write a bounded time (SIEVE_WRITE_TIMEOUT_S) or until its client hangs up: then
503 `write_pending`, nothing acknowledged, and the write stays queued: the writer still applies it."""
from __future__ import annotations

import queue
import threading
import time

import pytest

from sieve.service.updates import IndexUpdater, Write, WritePending
from tests.server import Server


def stalled_updater() -> IndexUpdater:
    """An updater whose writer thread never runs: only its queue, as submit() uses it."""
    updater = IndexUpdater.__new__(IndexUpdater)
    updater.queue = queue.Queue()
    return updater


def test_a_write_not_applied_in_time_is_pending_and_stays_queued():
    updater, write = stalled_updater(), Write(delete="d1")
    started = time.monotonic()
    with pytest.raises(WritePending, match="SIEVE_WRITE_TIMEOUT_S"):
        updater.submit(write, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 2.0
    assert updater.queue.get_nowait() is write and not write.future.cancelled()
    write.future.set_running_or_notify_cancel()  # as the writer applies it: its result can still be set
    write.future.set_result({"deleted": ["d1"]})


def test_a_write_whose_client_hung_up_stops_waiting():
    updater, write, gone = stalled_updater(), Write(delete="d1"), threading.Event()
    threading.Timer(0.2, gone.set).start()
    started = time.monotonic()
    with pytest.raises(WritePending, match="hung up"):
        updater.submit(write, timeout_s=60, cancelled=gone)
    assert time.monotonic() - started < 5.0 and not write.future.cancelled()


def test_an_applied_write_answers_before_its_timeout():
    updater, write = stalled_updater(), Write(delete="d1")
    threading.Timer(0.1, lambda: write.future.set_result({"deleted": ["d1"]})).start()
    assert updater.submit(write, timeout_s=30) == {"deleted": ["d1"]}


def test_http_write_past_its_timeout_is_503_and_is_still_applied(index_copy, tmp_path):
    """The writer's group wait (20 ms) alone outlasts a 1 ms write timeout: 503, then the document appears."""
    server = Server({"SIEVE_INDEX_DIR": str(index_copy), "SIEVE_WRITE_TIMEOUT_S": "0.001"}, tmp_path / "s.log")
    try:
        with server.client() as client:
            doc = {"id": "late-1", "title": "Kites", "text": "A kite flies on the wind."}
            answer = client.post("/documents", json={"documents": [doc]})
            assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
            error = answer.json()["error"]
            assert error["code"] == "write_pending" and "again" in error["allowed"]
            deadline = time.monotonic() + 60
            while client.get("/documents/late-1").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert client.get("/documents/late-1").json()["title"] == "Kites"
            gone = client.delete("/documents/late-1")
            assert gone.status_code == 503 and gone.json()["error"]["code"] == "write_pending"
    finally:
        server.stop()
