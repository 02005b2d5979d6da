"""Impressions, recorded off the request path: the handler puts (request id, what was shown, the outcome) on a
queue and returns; one background thread turns them into records (records.py) and appends them in batches to the
impressions log (one fsync per batch). The shown ids are kept in memory at once, so POST /feedback can validate an
event the moment the answer left; an id not in memory (another worker process's answer, or an old one) is looked
up in the log on disk. `durable(request_id)` waits until that request's impression is on disk: an event is
acknowledged only when the impression it refers to is stored too."""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from pathlib import Path

from sieve.feedback.log import AppendLog
from sieve.feedback.records import first_stage, query_key

log = logging.getLogger("sieve")
BATCH = 256
FLUSH_S = 0.2


class DiskImpressions:
    """request id -> shown ids of impressions on disk (every process's segments), read incrementally."""

    def __init__(self, log_: AppendLog, limit: int):
        self.log, self.limit = log_, limit
        self.offsets: dict[Path, int] = {}
        self.shown: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, request_id: str) -> tuple[str, ...] | None:
        with self.lock:
            if request_id not in self.shown:
                self.read_new()
            return self.shown.get(request_id)

    def read_new(self) -> None:
        for path in self.log.segments():
            offset = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except FileNotFoundError:
                continue
            whole = data[:data.rfind(b"\n") + 1]
            self.offsets[path] = offset + len(whole)
            for record in read_segment_bytes(whole):
                self.shown[record["request_id"]] = tuple(record.get("shown", ()))
        while len(self.shown) > self.limit:
            self.shown.popitem(last=False)


def read_segment_bytes(data: bytes):
    for line in data.splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


class ImpressionRecorder:
    def __init__(self, root: Path, retention_bytes: int, depth: int, keep_text: bool, memory: int):
        self.log = AppendLog(root, "impressions", retention_bytes)
        self.depth, self.keep_text, self.memory = depth, keep_text, memory
        self.shown: OrderedDict[str, tuple[str, ...]] = OrderedDict()  # request id -> shown ids (this process)
        self.disk = DiskImpressions(self.log, memory)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.queued = self.written = 0
        self.done = threading.Condition()
        self.seq_of: dict[str, int] = {}
        self.healthy = True  # False after an impression batch failed to be written (e.g. disk full)
        self.flush_now = threading.Event()
        self.thread = threading.Thread(target=self.run, name="sieve-impressions", daemon=True)
        self.thread.start()

    # -- request path: a few dict operations, no I/O ---------------------------------------------------------
    def record(self, request_id: str, endpoint: str, query: str, shown: list[str], outcome=None,
               swap: int | None = None, explore: list | None = None) -> None:
        with self.done:
            self.queued += 1
            self.seq_of[request_id] = self.queued
            self.shown[request_id] = tuple(shown)
            while len(self.shown) > self.memory:
                old, _ = self.shown.popitem(last=False)
                self.seq_of.pop(old, None)
        self.jobs.put((request_id, endpoint, query, list(shown), outcome, swap, time.time(), explore))

    # -- POST /feedback ---------------------------------------------------------------------------------------
    def shown_ids(self, request_id: str) -> tuple[str, ...] | None:
        with self.done:
            found = self.shown.get(request_id)
        if found is None:
            found = self.disk.get(request_id)
        if found is None:  # another worker's answer may still be in its writer's batch: one flush interval later
            time.sleep(FLUSH_S + 0.1)
            found = self.disk.get(request_id)
        return found

    def durable(self, request_id: str, timeout_s: float = 10.0) -> bool:
        """Wait until this process's impression of `request_id` is fsynced (True at once for one read from disk)."""
        with self.done:
            seq = self.seq_of.get(request_id, 0)
            if self.written < seq:
                self.flush_now.set()
            return self.done.wait_for(lambda: self.written >= seq, timeout=timeout_s) and self.healthy

    # -- the writer thread --------------------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            jobs = [self.jobs.get()]
            if jobs[0] is None:
                return
            # group commit: gather for up to FLUSH_S (one fsync per batch, not per answer: the thread competes with
            # the models for the cores), at once when POST /feedback waits on an impression (durable)
            self.flush_now.wait(FLUSH_S)
            while len(jobs) < BATCH:
                try:
                    jobs.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            self.flush_now.clear()
            stop = jobs[-1] is None
            jobs = [j for j in jobs if j is not None]
            try:
                self.log.append([self.to_record(*job) for job in jobs])
                self.healthy = True
            except Exception:  # noqa: BLE001 - a full disk must not stop the server; events against them are 503
                log.exception("could not write %d impressions", len(jobs))
                self.healthy = False
            with self.done:
                self.written += len(jobs)
                self.done.notify_all()
            if stop:
                return

    def to_record(self, request_id, endpoint, query, shown, outcome, swap, t, explore=None) -> dict:
        normalised = " ".join(query.split())
        record = {"request_id": request_id, "t": round(t, 3), "endpoint": endpoint,
                  "query_key": query_key(normalised), "shown": shown, "swap": swap}
        if explore:
            record["explore"] = explore  # [[position, served rank], ...]: deeper candidates shown (feedback_service)
        if self.keep_text:
            record["query"] = query
        if outcome is not None:
            record.update(first_stage(outcome, self.depth))
        return record

    def close(self) -> None:
        self.jobs.put(None)
        self.flush_now.set()
        self.thread.join(timeout=30)
        self.log.close()
