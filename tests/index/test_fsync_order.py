"""Durability at the syscall level: the order of fsyncs, renames and the CURRENT switch during one live write.

A SIGKILL test cannot see a missing fsync (the page cache outlives the process); this one records what the
writer asks of the kernel, in order, and checks the rules a power cut needs:
  1. every file and directory of the staging version is fsynced, unchanged since, before the staging dir is renamed;
  2. versions/ is fsynced after that rename and before CURRENT is replaced;
  3. CURRENT.tmp is fsynced, unchanged since, before os.replace makes it CURRENT;
  4. the index directory is fsynced after the replace;
  5. the write is acknowledged (service/updates.py resolves the request's future) only after all of the above.
The negative cases remove one fsync (or acknowledge early) and require the checker to name what is missing.
"""
from __future__ import annotations

import os
import re
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

import sieve.service.updates
from sieve.index import Document, SearchIndex
from sieve.index.layout import read_current
from sieve.service.updates import IndexUpdater, Write

_TMP_RE = re.compile(r"\.tmp-[0-9a-f]+")


@dataclass
class Event:
    op: str                  # fsync | rename | replace | ack
    path: str                # absolute path fsynced, or the source of a rename/replace
    dst: str = ""
    stat: tuple | None = None                              # (size, mtime_ns) when fsynced / replaced
    tree: dict[str, tuple] = field(default_factory=dict)  # staging tree at the rename: path -> (size, mtime_ns)


def _stat(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns)


class Recorder:
    """Wraps os.fsync / os.rename / os.replace; `drop(path)` True makes one fsync a no-op (the line removed)."""

    def __init__(self, monkeypatch, drop: Callable[[str], bool] = lambda path: False):
        self.events: list[Event] = []
        self.lock = threading.Lock()
        real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

        def fsync(fd):
            path = os.readlink(f"/proc/self/fd/{fd}")
            if drop(path):
                return None
            real_fsync(fd)
            self.add(Event("fsync", path, stat=_stat(os.fstat(fd))))

        def rename(src, dst, **kw):
            tree = {str(p): _stat(p.stat()) for p in [Path(src), *Path(src).rglob("*")]}
            real_rename(src, dst, **kw)
            self.add(Event("rename", str(src), str(dst), tree=tree))

        def replace(src, dst, **kw):
            st = _stat(os.stat(src))
            real_replace(src, dst, **kw)
            self.add(Event("replace", str(src), str(dst), stat=st))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(os, "replace", replace)

    def add(self, event: Event) -> None:
        with self.lock:
            self.events.append(event)

    def ack(self, _future: Future) -> None:
        self.add(Event("ack", ""))


def violations(events: list[Event], index_dir: Path) -> list[str]:
    """Every broken durability rule, as a sentence; [] when the write was durable before it was acknowledged."""
    index_dir, found = str(index_dir), []
    versions = os.path.join(index_dir, "versions")
    current_tmp, current = os.path.join(index_dir, "CURRENT.tmp"), os.path.join(index_dir, "CURRENT")

    def first(pred, start=0) -> int | None:
        return next((i for i, e in enumerate(events) if i >= start and pred(e)), None)

    i_rename = first(lambda e: e.op == "rename" and os.path.dirname(e.dst) == versions)
    i_replace = first(lambda e: e.op == "replace" and (e.path, e.dst) == (current_tmp, current))
    i_ack = first(lambda e: e.op == "ack")
    if i_rename is None or i_replace is None or i_ack is None:
        return [f"incomplete write: rename={i_rename} replace={i_replace} ack={i_ack}"]
    fsynced = {(e.path, e.stat) for e in events[:i_rename] if e.op == "fsync"}
    for path, st in events[i_rename].tree.items():
        if (path, st) not in fsynced:
            found.append(f"{_short(path, index_dir)} not fsynced (as it is now) before the staging rename")
    i_versions = first(lambda e: e.op == "fsync" and e.path == versions, i_rename)
    if i_versions is None or i_versions > i_replace:
        found.append("versions/ not fsynced between the staging rename and the CURRENT replace")
    if (current_tmp, events[i_replace].stat) not in {(e.path, e.stat) for e in events[:i_replace] if e.op == "fsync"}:
        found.append("CURRENT.tmp not fsynced (as it is now) before os.replace")
    i_index = first(lambda e: e.op == "fsync" and e.path == index_dir, i_replace)
    if i_index is None:
        found.append("the index directory not fsynced after the CURRENT replace")
    last_needed = max(x for x in (i_rename, i_versions, i_replace, i_index) if x is not None)
    if i_ack < last_needed:
        found.append(f"acknowledged at event {i_ack}, before the durability steps ending at event {last_needed}")
    return found


def _short(path: str, index_dir: str) -> str:
    return _TMP_RE.sub(".tmp-*", os.path.relpath(path, index_dir)) if path.startswith(index_dir) else path


def sequence(events: list[Event], index_dir: Path) -> list[str]:
    """The recorded events as short lines, paths relative to the index directory."""
    d = str(index_dir)
    return [f"{e.op:8s}{_short(e.path, d)}" + (f" -> {_short(e.dst, d)}" if e.dst else "") for e in events]


def write_through_updater(index_dir: Path, encoder, recorder: Recorder) -> dict:
    """One POST /documents as the HTTP handler does it: a Write submitted to the group-commit writer thread."""
    searcher = type("Searcher", (), {})()
    searcher.index = SearchIndex.load(index_dir)
    updater = IndexUpdater(searcher, index_dir, {"primary": encoder}, lambda: SearchIndex.load(index_dir), wait_ms=0)
    try:
        write = Write(upserts=[Document("fsync-new", "", "zebra quokka")])
        write.future.add_done_callback(recorder.ack)  # runs in the writer thread, at the moment of acknowledgement
        return updater.submit(write)
    finally:
        updater.close()
        updater.thread.join(timeout=30)


def test_a_write_is_fsynced_renamed_and_switched_before_it_is_acknowledged(built: Path, encoder, monkeypatch):
    recorder = Recorder(monkeypatch)
    result = write_through_updater(built, encoder, recorder)
    monkeypatch.undo()
    print("\n".join(sequence(recorder.events, built)))
    assert result["index_version"] == 2 and read_current(built) == "v000002"
    assert violations(recorder.events, built) == []
    staging = next(e.path for e in recorder.events if e.op == "rename")
    synced = {os.path.relpath(e.path, staging) for e in recorder.events
              if e.op == "fsync" and e.path.startswith(staging)}
    # the write's segment (small: searched exactly, no faiss.index) and the version's manifest
    assert {"docs.sqlite", "embeddings.npy", "manifest.json", "bm25", "bm25/docs.npy"} <= synced


def _ack_before_commit(monkeypatch) -> list[threading.Thread]:
    """An updater that acknowledges at once and commits in the background: the bug the ack rule exists for."""
    real, threads = sieve.service.updates.apply_changes, []

    def early(*args, **kwargs):
        t = threading.Thread(target=real, args=args, kwargs=kwargs)
        threads.append(t)
        t.start()

    monkeypatch.setattr(sieve.service.updates, "apply_changes", early)
    return threads


DROPS = {  # one fsync removed -> the sentence the checker must print
    "a version file": (lambda p: p.endswith("/docs.sqlite") and ".tmp-" in p, "docs.sqlite not fsynced"),
    "a version subdirectory": (lambda p: p.endswith("/bm25") and ".tmp-" in p, "/bm25 not fsynced"),
    "the staging directory": (lambda p: _TMP_RE.search(p.rsplit("/", 1)[-1]) is not None,
                              "versions/.tmp-* not fsynced"),
    "versions/ after the rename": (lambda p: p.endswith("/idx/versions"), "versions/ not fsynced"),
    "CURRENT.tmp": (lambda p: p.endswith("/CURRENT.tmp"), "CURRENT.tmp not fsynced"),
    "the index dir after the replace": (lambda p: p.endswith("/idx"), "index directory not fsynced"),
}


@pytest.mark.parametrize("missing", [*DROPS, "ack before commit"])
def test_the_checker_names_each_missing_step(built: Path, encoder, monkeypatch, missing):
    drop, expected = DROPS.get(missing, (lambda p: False, "acknowledged at event"))
    recorder = Recorder(monkeypatch, drop)
    threads = _ack_before_commit(monkeypatch) if missing == "ack before commit" else []
    write_through_updater(built, encoder, recorder)
    for t in threads:
        t.join(timeout=30)
    monkeypatch.undo()
    found = violations(recorder.events, built)
    assert any(expected in v for v in found), (missing, found)
