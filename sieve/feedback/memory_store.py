"""Where an index keeps its click memory (memory.py), and the atomic switch to a new one: the adapted CMC's protocol
(index/adapted.py) in a directory of its own, so a memory belongs to the index whose documents it names.

    DIR/clicks/CURRENT       name of the live memory, e.g. "m000003" (absent: none published)
    DIR/clicks/m000003/      memory.json (weights, prior, f per pair and per document) and report.json
    DIR/clicks/.tmp-<random> one being written (never live)

Written and fsynced under a temporary name, renamed, and only then named in CURRENT (replaced atomically); a server
on the index loads the new one on its next check (POST /admin/index/reload or SIEVE_INDEX_POLL_S), every worker
process on its own (several workers look every 2 s by default: Settings.poll_s). The previous one is kept until the
next publish.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path

from sieve.index.adapted import _fsync_tree
from sieve.index.layout import fsync_dir
from sieve.feedback.memory import FILE

CLICKS = "clicks"
KEEP = 2
_NAME_RE = re.compile(r"^m(\d{6,})$")


class MemoryStore:
    def __init__(self, index_dir: str | Path):
        self.root = Path(index_dir) / CLICKS

    def current(self) -> Path | None:
        try:
            name = (self.root / "CURRENT").read_text(encoding="utf-8").strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        path = self.root / name
        return path if _NAME_RE.match(name) and (path / FILE).is_file() else None

    def new_work_dir(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f".tmp-{secrets.token_hex(6)}"
        path.mkdir()
        return path

    def existing(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _NAME_RE.match(p.name)))

    def publish(self, work_dir: Path) -> Path:
        """Make the fully written `work_dir` the live memory; returns its final path."""
        _fsync_tree(work_dir)
        final = self.root / f"m{(self.existing() or [0])[-1] + 1:06d}"
        os.rename(work_dir, final)
        tmp = self.root / f".CURRENT-{secrets.token_hex(4)}"
        tmp.write_text(final.name, encoding="utf-8")
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, self.root / "CURRENT")
        fsync_dir(self.root)
        for old in self.existing()[:-KEEP]:
            shutil.rmtree(self.root / f"m{old:06d}", ignore_errors=True)
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return final
