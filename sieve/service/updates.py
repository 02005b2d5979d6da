"""Live index updates: POST /documents, DELETE /documents/{id} and reloads go through one writer thread.

Group commit: the writer takes every write queued within SIEVE_WRITE_BATCH_WAIT_MS of the first and applies them
as one new index version (index.apply_changes: staged, fsynced, renamed, CURRENT switched atomically). Only then
is the new version loaded and swapped in as `searcher.index` (one reference assignment), and only then are the
writes acknowledged: an acknowledged write is durable and visible to the next search; a request already running
finishes on the version it started with; a crash leaves the old or the new version, never a mix.
Cost: a version adds one segment holding the group's documents plus tombstones, so it costs what the group holds,
not what the index holds (sieve/index/segments.py). After a commit the merger thread folds small segments together
(sieve/index/compaction.py, MergePolicy from the SIEVE_INDEX_* settings) without holding up writes or searches, and swaps
in the merged version. See docs/index.md.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from starlette.exceptions import HTTPException

from sieve.index import Document, IndexMismatchError, UnknownDocumentError, apply_changes, merge_if_due
from sieve.index.compaction import MergePolicy
from sieve.index.layout import read_current, version_name
from sieve.pipeline.runner import result_within

log = logging.getLogger("sieve.updates")
MAX_GROUP_DOCS = 10_000  # one group commit holds at most this many upserted documents


@dataclass(eq=False)  # identity, not value: writes are kept in sets
class Write:
    upserts: list[Document] = field(default_factory=list)
    delete: str | None = None
    reload: bool = False
    future: Future = field(default_factory=Future)


class WritePending(Exception):
    """A write not applied within SIEVE_WRITE_TIMEOUT_S, or whose client hung up first (HTTP 503 `write_pending`):
    nothing was acknowledged, and the write stays queued: the writer applies it unless the server stops first.
    Sending it again is safe: an upsert replaces by id; a delete that already happened answers 404."""


class Conflict(HTTPException):
    def __init__(self, message: str):
        super().__init__(409, message)


class IndexUpdater:
    def __init__(self, searcher, index_dir, encoders: dict, load_index, wait_ms: float, on_swap=None,
                 poll_s: float = 0, merge_policy: MergePolicy | None = MergePolicy(), on_check=None,
                 catch_up: bool = False):
        """on_check() -> bool: called in this thread on every poll and reload, for what lives beside the index
        versions (the adapted CMC, service/cmc_serving.py); True = it changed what is served. catch_up: one of
        several workers of a server; requests call behind()/catch_up() before they read the index."""
        self.searcher, self.index_dir, self.encoders = searcher, index_dir, encoders
        self.current_file = Path(index_dir) / "CURRENT"
        self.catching_up = catch_up
        self.seen = self.current_mark()  # CURRENT as of the loaded version (its inode changes on every publish)
        self.catch_lock = threading.Lock()
        self.on_check = on_check
        self.load_index, self.wait_s, self.on_swap = load_index, wait_ms / 1000, on_swap
        self.poll_s = poll_s or None  # None: block until a write or reload arrives
        self.queue: queue.Queue = queue.Queue()  # not SimpleQueue: its timed get can hang (pipeline/batching.py)
        self.lock = threading.Lock()  # one swap at a time
        self.thread = threading.Thread(target=self.loop, name="index-writer", daemon=True)
        self.thread.start()
        self.merge_policy, self.merge_wanted = merge_policy, threading.Event()
        self.closing = False
        self.merger = threading.Thread(target=self.merge_loop, name="index-merger", daemon=True)
        if merge_policy is not None:
            self.merger.start()

    # -- requests ---------------------------------------------------------------------------------------------
    def submit(self, write: Write, timeout_s: float | None = None, cancelled: threading.Event | None = None) -> dict:
        """The write's result once it is applied (durable and visible); WritePending after `timeout_s` or once
        `cancelled` is set (the client hung up), the write left queued (its future is never cancelled: the writer
        still applies it and sets its result)."""
        self.queue.put(write)
        gone = cancelled.is_set if cancelled is not None else (lambda: False)
        result = result_within(write.future, timeout_s, gone)  # a write's result is a dict, never None
        if result is not None:
            return result
        if gone():
            raise WritePending("the client hung up before the write was applied; it stays queued")
        raise WritePending(f"the write was not applied within {timeout_s:g} s (SIEVE_WRITE_TIMEOUT_S); it stays queued "
                           "and is applied unless the server stops first")

    def upsert(self, docs: list[Document], timeout_s: float | None = None,
               cancelled: threading.Event | None = None) -> dict:
        return self.submit(Write(upserts=docs), timeout_s, cancelled)

    def delete(self, doc_id: str, timeout_s: float | None = None, cancelled: threading.Event | None = None) -> dict:
        return self.submit(Write(delete=doc_id), timeout_s, cancelled)

    def reload(self, timeout_s: float | None = None, cancelled: threading.Event | None = None) -> dict:
        return self.submit(Write(reload=True), timeout_s, cancelled)

    def close(self) -> None:
        self.queue.put(None)
        self.closing = True
        self.merge_wanted.set()

    # -- read your writes across worker processes ---------------------------------------------------------------
    def current_mark(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.current_file)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def behind(self) -> bool:
        """Whether CURRENT changed since this worker last looked (one stat): another worker may have published."""
        return self.catching_up and self.current_mark() != self.seen

    def catch_up(self) -> None:
        """Swap in the version CURRENT names when it is not the one loaded (a request thread, before it reads the
        index): a write another worker acknowledged is then read here too."""
        mark = self.current_mark()
        with self.catch_lock:
            if mark == self.seen:
                return
            if self.newer_on_disk():
                self.swap(None)
            self.seen = mark

    # -- the merger thread ------------------------------------------------------------------------------------
    def merge_loop(self) -> None:
        """Merge segments while the policy says so, after commits; writes and searches go on meanwhile."""
        while True:
            self.merge_wanted.wait()
            self.merge_wanted.clear()
            if self.closing:
                return
            try:
                while not self.closing and merge_if_due(self.index_dir, self.merge_policy) is not None:
                    self.swap(None)
            except Exception:  # noqa: BLE001 - a failed merge changes nothing; the next commit tries again
                log.exception("merging the segments of %s failed", self.index_dir)

    # -- the writer thread ------------------------------------------------------------------------------------
    def loop(self) -> None:
        while True:
            try:
                first = self.queue.get(timeout=self.poll_s)
            except queue.Empty:  # nothing to write: has another writer (CLI, replica) published a version?
                self.check_beside()
                first = Write(reload=True) if self.newer_on_disk() else None
                if first is None:
                    continue
            if first is None:
                return
            group = self.collect(first)
            try:
                self.apply(group)
            except BaseException as exc:  # noqa: BLE001 - each waiter gets the error, the writer lives on
                log.exception("index write of %d request(s) failed", len(group))
                for write in group:
                    if not write.future.done():
                        write.future.set_exception(exc)

    def collect(self, first: Write) -> list[Write]:
        group, deadline = [first], time.monotonic() + self.wait_s
        while sum(len(w.upserts) for w in group) < MAX_GROUP_DOCS:
            try:
                write = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if write is None:
                self.queue.put(None)
                break
            group.append(write)
        return group

    def apply(self, group: list[Write]) -> None:
        before = self.searcher.index.version
        if self.newer_on_disk():  # another writer (replica, CLI) published: judge deletes against its version
            self.swap(None)
        done = self.commit([w for w in group if not w.reload])
        if any(w.reload for w in group) and self.newer_on_disk():  # published while this group committed
            self.swap(None)
        cmc_changed = self.check_beside() if any(w.reload for w in group) else False
        index = self.searcher.index
        for write in group:
            if write.reload:
                write.future.set_result({"index_version": index.version, "previous_version": before,
                                         "index_size": index.size, "changed": index.version != before,
                                         "cmc_changed": cmc_changed})
            elif write in done:
                write.future.set_result({"index_version": index.version, "index_size": index.size,
                                         "upserted": len(write.upserts),
                                         "deleted": [write.delete] if write.delete else []})

    def commit(self, writes: list[Write], attempts: int = 3) -> set:
        """One new version with every write that can be applied; each other write fails on its own future. When
        another writer deleted an id between the judging and the writer lock, judge again on its version."""
        for attempt in range(attempts):
            upserts, deletes, done = self.net_effect([w for w in writes if not w.future.done()])
            if not (upserts or deletes):
                return done
            started = time.perf_counter()
            try:
                apply_changes(self.index_dir, list(upserts.values()), sorted(deletes), self.encoders)
            except UnknownDocumentError:
                if attempt == attempts - 1:
                    raise
                self.swap(None)
                continue
            except (ValueError, IndexMismatchError) as exc:  # e.g. the index holds a store this server cannot encode
                raise Conflict(f"the index cannot take this write: {exc}") from exc
            self.swap(time.perf_counter() - started)
            self.merge_wanted.set()
            return done
        return set()

    def net_effect(self, writes: list[Write]) -> tuple[dict[str, Document], set[str], set]:
        """Writes in arrival order reduced to (upserts by id, ids to delete); a delete of an id that does not
        exist at its turn fails alone (404) and the rest go on."""
        index = self.searcher.index
        upserts: dict[str, Document] = {}
        deletes: set[str] = set()
        done = set()
        for w in writes:
            for doc in w.upserts:
                upserts[doc.id] = doc
                deletes.discard(doc.id)
            if w.delete is not None:
                exists = w.delete in upserts or (w.delete not in deletes and index.has_id(w.delete))
                if not exists:
                    w.future.set_exception(UnknownDocumentError([w.delete], size=index.size))
                    continue
                upserts.pop(w.delete, None)
                if index.has_id(w.delete):
                    deletes.add(w.delete)
            done.add(w)
        if index.size + sum(not index.has_id(i) for i in upserts) - len(deletes) < 1:
            for w in list(done):
                if w.delete is not None:
                    w.future.set_exception(Conflict("cannot delete the last document: an index holds at least one"))
                    done.discard(w)
            return self.net_effect([w for w in writes if w in done]) if done else ({}, set(), set())
        return upserts, deletes, done

    def check_beside(self) -> bool:
        if self.on_check is None:
            return False
        try:
            return bool(self.on_check())
        except Exception:  # noqa: BLE001 - what is served stays as it was; the next poll or reload tries again
            log.exception("checking %s for a new adapted CMC failed", self.index_dir)
            return False

    def newer_on_disk(self) -> bool:
        try:
            return read_current(Path(self.index_dir)) != version_name(self.searcher.index.version)
        except Exception:  # noqa: BLE001 - a damaged CURRENT is reported by the next explicit reload
            log.exception("could not read %s/CURRENT", self.index_dir)
            return False

    def swap(self, commit_s: float | None) -> None:
        """Load the live version from disk and make it the one new requests read (in-flight ones keep theirs)."""
        with self.lock:
            current = self.searcher.index
            fresh = self.load_index()
            if fresh.version == current.version:
                fresh.close()
                return
            self.searcher.index = fresh
        log.info("index version %d -> %d (%d documents)", current.version, fresh.version, fresh.size)
        if self.on_swap:
            self.on_swap(fresh, commit_s)
