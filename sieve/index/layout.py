"""On-disk layout of an index directory and the atomic version switch.

    DIR/CURRENT                   name of the live version, e.g. "v000003"
    DIR/versions/v000003/...      one immutable directory per version: its manifest, its tombstones and the one
                                  segment it wrote, if any (later versions list that segment too; index/segments.py)
    DIR/versions/.tmp-<random>/   a version being written (never live)
    DIR/versions/.merge-<random>/ a merged segment being written without the writer lock (index/compaction.py)

A version directory is fully written and fsynced before it is renamed to its
final name, and CURRENT is replaced atomically afterwards, so a crash at any
point leaves either the old or the new version live.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from .errors import IndexFormatError, IndexNotFoundError

KEEP_VERSIONS = 2
_VERSION_RE = re.compile(r"^v(\d{6,})$")


def version_name(version: int) -> str:
    return f"v{version:06d}"


def versions_dir(index_dir: Path) -> Path:
    return index_dir / "versions"


def read_current(index_dir: Path) -> str | None:
    """Name of the live version, or None if the directory was never built."""
    try:
        name = (index_dir / "CURRENT").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if not _VERSION_RE.match(name):
        raise IndexFormatError(f"{index_dir}/CURRENT holds {name!r}, expected a version "
                               "name like 'v000003'; rebuild with `sieve index build`")
    return name


def current_version_dir(index_dir: str | Path) -> Path:
    """The live version directory; IndexNotFoundError if there is none."""
    index_dir = Path(index_dir)
    name = read_current(index_dir)
    if name is None:
        raise IndexNotFoundError(
            f"no index at {index_dir} (no CURRENT file); run "
            f"`sieve index build --corpus CORPUS.jsonl --out {index_dir}` first")
    vdir = versions_dir(index_dir) / name
    if not vdir.is_dir():
        raise IndexFormatError(f"{index_dir}/CURRENT names {name}, but {vdir} is missing; "
                               "rebuild with `sieve index build`")
    return vdir


def live_version_number(index_dir: Path) -> int:
    """Number of the live version, 0 if none (so the next one is this + 1)."""
    name = read_current(index_dir)
    return 0 if name is None else int(_VERSION_RE.match(name).group(1))


def rebuild_version_number(index_dir: Path) -> int:
    """Next version for a full build: live + 1, or past every version on disk when
    CURRENT is damaged (a full rebuild is the documented remedy, so it must work)."""
    try:
        return live_version_number(index_dir) + 1
    except IndexFormatError:
        vdirs = versions_dir(index_dir)
        names = [p.name for p in vdirs.iterdir()] if vdirs.is_dir() else []
        numbers = [int(m.group(1)) for n in names if (m := _VERSION_RE.match(n))]
        return max(numbers, default=0) + 1


@contextlib.contextmanager
def writer_lock(index_dir: Path) -> Iterator[None]:
    """Serialise writers of one index directory (readers never lock)."""
    index_dir.mkdir(parents=True, exist_ok=True)
    with open(index_dir / ".lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def staging_dir(index_dir: Path) -> Iterator[Path]:
    """A fresh temp version directory, removed if the block fails."""
    vdirs = versions_dir(index_dir)
    vdirs.mkdir(parents=True, exist_ok=True)
    tmp = vdirs / f".tmp-{secrets.token_hex(8)}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        # After a successful commit the temp name no longer exists.
        shutil.rmtree(tmp, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_dir():
            fsync_dir(path)
        else:
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(root)


def commit_version(index_dir: Path, tmp: Path, version: int, keep: int = KEEP_VERSIONS) -> Path:
    """Make the fully written `tmp` the live version `version`; return its final path."""
    _fsync_tree(tmp)
    final = versions_dir(index_dir) / version_name(version)
    if final.exists():
        # Left by a crash between the rename and the CURRENT switch: never live.
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    _switch_current(index_dir, final.name)
    _prune(index_dir, keep=keep)
    return final


def _switch_current(index_dir: Path, name: str) -> None:
    tmp = index_dir / "CURRENT.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, index_dir / "CURRENT")
    fsync_dir(index_dir)


def _prune(index_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` versions and the segments they list, and stale temp dirs (best effort)."""
    vdirs = versions_dir(index_dir)
    numbered = sorted((int(m.group(1)), p) for p in vdirs.iterdir()
                      if (m := _VERSION_RE.match(p.name)))
    kept = [p for _, p in numbered[-keep:]]
    needed = {p.name for p in kept}
    for path in kept:
        needed.update(_listed_segments(path))
    stale = [p for _, p in numbered if p.name not in needed]
    # Safe under the writer lock: no other writer can own a temp dir now.
    stale += [p for p in vdirs.iterdir() if p.name.startswith(".tmp-")]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)


def _listed_segments(version_dir: Path) -> list[str]:
    import json

    try:
        data = json.loads((version_dir / "manifest.json").read_text(encoding="utf-8"))
        return [str(s["name"]) for s in data.get("segments", [])]
    except (OSError, ValueError, KeyError, TypeError):
        return []
