"""An append-only, fsynced log of JSON records, in segments: what impressions and feedback events are kept in.

Written like the index's write-ahead protocol (index/layout.py): a batch of records is one `write` of whole lines
followed by `fsync` before the caller is told it is stored, so an acknowledged record survives SIGKILL or a power loss
(a crash mid-batch can leave a torn last line, which readers skip). Each process appends to segments of its own
(`NAME-<pid>-<seq>.jsonl`: several worker processes never share a file); a segment past SEGMENT_BYTES is closed and a
new one started; past `retention_bytes` in all, the oldest segments are deleted (the retention limit).
"""
from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Iterable, Iterator

from sieve.index.layout import fsync_dir

SEGMENT_BYTES = 32 * 1024 * 1024
_SEGMENT = re.compile(r"^(?P<name>[a-z]+)-(?P<pid>\d+)-(?P<seq>\d{6})\.jsonl$")


class AppendLog:
    def __init__(self, root: Path, name: str, retention_bytes: int, segment_bytes: int = SEGMENT_BYTES):
        self.root, self.name = Path(root), name
        self.retention_bytes, self.segment_bytes = retention_bytes, segment_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.handle = None
        self.seq = 0

    def segments(self) -> list[Path]:
        """Every segment of this log (all processes), oldest first (by modification time, then name)."""
        found = [p for p in self.root.iterdir() if (m := _SEGMENT.match(p.name)) and m["name"] == self.name]
        return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))

    def append(self, records: Iterable[dict]) -> int:
        """Write the records as lines and fsync; returns how many. Durable once this returns."""
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        if not data:
            return 0
        with self.lock:
            handle = self.open_segment()
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            if handle.tell() >= self.segment_bytes:
                handle.close()
                self.handle = None
                self.enforce_retention()
        return data.count(b"\n")

    def open_segment(self):
        if self.handle is None:
            self.seq += 1
            path = self.root / f"{self.name}-{os.getpid()}-{self.seq:06d}.jsonl"
            while path.exists():
                self.seq += 1
                path = self.root / f"{self.name}-{os.getpid()}-{self.seq:06d}.jsonl"
            self.handle = open(path, "ab")
            fsync_dir(self.root)  # the new file's name is durable too
        return self.handle

    def enforce_retention(self) -> None:
        """Delete the oldest closed segments while the log is above its retention limit."""
        segments = self.segments()
        total = sum(p.stat().st_size for p in segments)
        current = Path(self.handle.name) if self.handle is not None else None
        for path in segments:
            if total <= self.retention_bytes:
                break
            if path != current:
                total -= path.stat().st_size
                path.unlink(missing_ok=True)
        fsync_dir(self.root)

    def close(self) -> None:
        with self.lock:
            if self.handle is not None:
                self.handle.close()
                self.handle = None


class Tail:
    """The records a log gained since the last call (every process's segments), whole lines only: a reader that
    follows the log as the writers append (`new()`)."""

    def __init__(self, log: AppendLog):
        self.log = log
        self.offsets: dict[Path, int] = {}

    def new(self) -> Iterator[dict]:
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
            for line in whole.splitlines():
                try:
                    yield json.loads(line)
                except ValueError:
                    continue


def read_records(root: Path, name: str) -> Iterator[dict]:
    """Every whole record of the log `name` under `root`, oldest segment first; a torn last line is skipped."""
    log = AppendLog.__new__(AppendLog)
    log.root, log.name = Path(root), name
    if not log.root.is_dir():
        return
    for path in log.segments():
        yield from read_segment(path)


def read_segment(path: Path, offset: int = 0) -> Iterator[dict]:
    with open(path, "rb") as handle:
        handle.seek(offset)
        for line in handle:
            if not line.endswith(b"\n"):
                return  # torn: written while the process died, never acknowledged
            try:
                yield json.loads(line)
            except ValueError:
                continue
