"""Where an index keeps the CMC that `sieve adapt` trained on its documents, and the atomic switch to a new one.

An adapted CMC belongs to the index it was trained on and is kept with it: `AdaptedStore` is what the server and the
publishers (`sieve adapt`, any later trainer) see: `current()` is the live adapted checkpoint as a local directory
(None: never adapted), `new_work_dir()` + `publish()` make a new one live. Two stores implement it: `LocalAdapted`
(below: a directory inside the local index) and `QdrantAdapted` (index/adapted_qdrant.py: inside the collection's
metadata collection, copied to a local cache to be loaded); `store_for` picks the one of an opened index.

The local layout:
    DIR/adapted/CURRENT        name of the live adapted CMC, e.g. "a000002" (absent: the index was never adapted)
    DIR/adapted/a000002/       a CMC checkpoint (models/cmc_checkpoint.py: config.json, cmc.safetensors) plus
                               model_card.md and documents.txt (the ids of the documents it adapted on, one a line)
    DIR/adapted/.tmp-<random>/ one being written (never live)

An adapted CMC is written and fsynced under a temporary name, renamed, and only then named in CURRENT (replaced
atomically), so a crash at any point leaves the previous adapted CMC (or none) live; the server notices a new
CURRENT and swaps the model in without a restart. The previous one is kept until the next publish.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Protocol, runtime_checkable

from .layout import fsync_dir

ADAPTED = "adapted"
DOCUMENTS = "documents.txt"
KEEP = 2
_NAME_RE = re.compile(r"^a(\d{6,})$")


def adapted_dir(index_dir: str | Path) -> Path:
    return Path(index_dir) / ADAPTED


def current_adapted(index_dir: str | Path) -> Path | None:
    """The live adapted CMC checkpoint of the index, or None when it was never adapted (or CURRENT is damaged)."""
    root = adapted_dir(index_dir)
    try:
        name = (root / "CURRENT").read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    path = root / name
    if not _NAME_RE.match(name) or not (path / "config.json").is_file():
        return None
    return path


def adapted_documents(path: str | Path) -> set[str]:
    """The ids of the documents an adapted CMC was trained on."""
    file = Path(path) / DOCUMENTS
    if not file.is_file():
        return set()
    return {line for line in file.read_text(encoding="utf-8").split("\n") if line}


def new_work_dir(index_dir: str | Path) -> Path:
    """A fresh temporary directory to write an adapted CMC into (then `publish` it)."""
    root = adapted_dir(index_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f".tmp-{secrets.token_hex(6)}"
    path.mkdir()
    return path


def _fsync_tree(path: Path) -> None:
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    fsync_dir(path)


def _existing(root: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _NAME_RE.match(p.name)))


def publish(index_dir: str | Path, work_dir: Path) -> Path:
    """Make the fully written `work_dir` the live adapted CMC; returns its final path. Older ones beyond KEEP and
    abandoned temporary directories are removed."""
    root = adapted_dir(index_dir)
    _fsync_tree(work_dir)
    number = (_existing(root) or [0])[-1] + 1
    final = root / f"a{number:06d}"
    os.rename(work_dir, final)
    tmp = root / f".CURRENT-{secrets.token_hex(4)}"
    tmp.write_text(final.name, encoding="utf-8")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, root / "CURRENT")
    fsync_dir(root)
    for old in _existing(root)[:-KEEP]:
        shutil.rmtree(root / f"a{old:06d}", ignore_errors=True)
    for stale in root.glob(".tmp-*"):
        if stale != work_dir:
            shutil.rmtree(stale, ignore_errors=True)
    return final


@runtime_checkable
class AdaptedStore(Protocol):
    """Where one index keeps its adapted CMCs (see the module's docstring)."""

    root: Path  # the local directory holding its checkpoints (served from here) and the publisher's work directory
    where: str  # what names the index it belongs to, in logs and messages

    def current(self) -> Path | None:
        """The live adapted checkpoint directory (config.json, cmc.safetensors, documents.txt, model_card.md), or
        None when the index was never adapted."""

    def new_work_dir(self) -> Path:
        """A fresh local directory to write a new adapted checkpoint into, then hand to `publish`."""

    def publish(self, work_dir: Path) -> Path:
        """Make the fully written `work_dir` the live adapted CMC (atomically: a reader sees the old or the new
        one); returns the new live checkpoint directory."""

    def owns(self, path: Path | None) -> bool:
        """Whether a checkpoint directory is one of this store's (the served CMC's source is then "adapted")."""


class LocalAdapted:
    """The adapted CMCs of a local index: DIR/adapted (the layout above)."""

    def __init__(self, index_dir: str | Path):
        self.index_dir, self.root = Path(index_dir), adapted_dir(index_dir)
        self.where = f"index {self.index_dir}"

    def current(self) -> Path | None:
        return current_adapted(self.index_dir)

    def new_work_dir(self) -> Path:
        return new_work_dir(self.index_dir)

    def publish(self, work_dir: Path) -> Path:
        return publish(self.index_dir, work_dir)

    def owns(self, path: Path | None) -> bool:
        return path is not None and Path(path).parent == self.root


def store_for(index, index_dir: str | Path, cache_dir: str | Path) -> AdaptedStore:
    """The store of an opened index: a Qdrant collection's own (copies cached under `cache_dir`), else the local
    index directory's."""
    from .qdrant_backend import QdrantIndex

    if isinstance(index, QdrantIndex):
        from .adapted_qdrant import QdrantAdapted

        return QdrantAdapted(index, Path(cache_dir) / "adapted")
    return LocalAdapted(index_dir)
