"""Impressions, recorded off the request path: the handler puts (request id, what was shown, the outcome) on a
queue and returns; one background thread turns them into records (records.py) and appends them in batches to the
impressions log (one fsync per batch). The shown ids are kept in memory at once, so POST /feedback can validate an
event the moment the answer left; an id not in memory (another worker process's answer, or an old one) is looked
up in the log on disk. `durable(request_id)` waits until that request's impression is on disk: an event is
acknowledged only when the impression it refers to is stored too."""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from sieve.feedback.log import AppendLog, Tail
from sieve.feedback.records import first_stage, query_key, unpack

log = logging.getLogger("sieve")
BATCH = 256
FLUSH_S = 0.2
VECTORS_KEPT = 20_000  # keep_vectors: the latest answers whose query vectors a click can still be matched with


def forget(vectors: dict) -> None:
    """The oldest query vectors dropped past VECTORS_KEPT (a dict keeps its insertion order)."""
    while len(vectors) > VECTORS_KEPT:
        del vectors[next(iter(vectors))]


class DiskImpressions:
    """request id -> shown ids of impressions on disk (every process's segments), read incrementally."""

    def __init__(self, log_: AppendLog, limit: int, keep_vectors: bool = False):
        self.log, self.limit, self.keep_vectors = log_, limit, keep_vectors
        self.tail = Tail(log_)
        self.shown: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self.vectors: dict[str, str] = {}  # request id -> the packed query vector (keep_vectors: exploration)
        self.lock = threading.Lock()

    def get(self, request_id: str) -> tuple[str, ...] | None:
        with self.lock:
            if request_id not in self.shown:
                self.read_new()
            return self.shown.get(request_id)

    def vector(self, request_id: str) -> np.ndarray | None:
        with self.lock:
            if request_id not in self.shown:
                self.read_new()
            packed = self.vectors.get(request_id)
        return None if packed is None else unpack(packed)

    def read_new(self) -> None:
        for record in self.tail.new():
            self.shown[record["request_id"]] = tuple(record.get("shown", ()))
            if self.keep_vectors and "vector" in record:
                self.vectors[record["request_id"]] = record["vector"]
        while len(self.shown) > self.limit:
            self.shown.popitem(last=False)
        forget(self.vectors)


class ImpressionRecorder:
    def __init__(self, root: Path, retention_bytes: int, depth: int, keep_text: bool, memory: int,
                 keep_vectors: bool = False):
        """`keep_vectors`: each answer's query vector is kept beside its shown ids (`vector`: exploration led by
        other users' clicks, service/feedback_service.py)."""
        self.log = AppendLog(root, "impressions", retention_bytes)
        self.depth, self.keep_text, self.memory, self.keep_vectors = depth, keep_text, memory, keep_vectors
        self.shown: OrderedDict[str, tuple[str, ...]] = OrderedDict()  # request id -> shown ids (this process)
        self.vectors: dict[str, np.ndarray] = {}  # request id -> its query vector (keep_vectors)
        self.disk = DiskImpressions(self.log, memory, keep_vectors)
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
            if self.keep_vectors and outcome is not None:
                vectors = outcome.state.query_vectors
                vector = vectors.get("cmc", vectors.get("be"))
                if vector is not None:  # a copy: a row of the batch's tensor would keep the whole batch alive
                    self.vectors[request_id] = vector.detach().float().cpu().numpy().reshape(-1).copy()
            while len(self.shown) > self.memory:
                old, _ = self.shown.popitem(last=False)
                self.seq_of.pop(old, None)
                self.vectors.pop(old, None)
            forget(self.vectors)
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

    def vector(self, request_id: str) -> np.ndarray | None:
        """The query vector of an answer (keep_vectors): this process's, else from the log on disk; None when it
        had none (a cached answer) or is not known."""
        with self.done:
            vector = self.vectors.get(request_id)
        if vector is not None:
            return vector
        return self.disk.vector(request_id) if self.keep_vectors else None

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
