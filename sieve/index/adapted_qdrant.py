"""A Qdrant collection's adapted CMCs, kept in the collection itself (index/adapted.py's AdaptedStore), so a server
on a Qdrant collection serves the model made for that collection and no other, wherever it runs.

In the metadata collection NAME__sieve, beside the metadata point:
- each file of an adapted checkpoint as points of CHUNK bytes (base64 in the payload), point ids
  `point_id("adapted/<version>/<file>/<i>")`;
- the metadata point's `adapted`: {"live": {"version": "a000002", "files": {name: {"sha256", "bytes", "chunks"}}},
  "kept": [the previous live record]}.
Publishing writes every chunk (each write waited for), then replaces `adapted` with one payload write: a reader sees
the old or the new version, never a part of one. The previous version's points are kept, older ones deleted.

A server loads a local copy, ROOT/<collection key>/<version>: fetched into a temporary directory, checked against the
sha256 of every file, then renamed into place (several processes may fetch at once: the first rename wins, the
others use it). The collection key hashes where the collection is, its name and its build (built_at, corpus hash),
so another collection, or this one rebuilt, never reads this copy. `sieve index build --recreate` drops the
metadata collection and with it the adapted CMCs (they were trained on the old build's documents).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path

from .layout import fsync_dir
from .qdrant_backend import META_POINT, QdrantIndex, point_id
from .qdrant_engine import NewPoint

CHUNK = 1 << 20  # bytes of a file per point (1.4 MB of base64): well inside a Qdrant server's request limit
STAMP = ".files.json"  # in a complete local copy: the files record it was checked against


def chunk_id(version: str, name: str, i: int) -> int:
    return point_id(f"adapted/{version}/{name}/{i}")


def stamp(files: dict) -> str:
    return json.dumps(files, sort_keys=True)


class QdrantAdapted:
    """The adapted CMCs of one Qdrant collection; local copies under `cache_root` (see the module's docstring)."""

    def __init__(self, index: QdrantIndex, cache_root: Path):
        self.index, self.cache_root = index, Path(cache_root)
        self.where = f"Qdrant collection {index.name!r} ({index.config.where})"
        self._root: Path | None = None

    @property
    def root(self) -> Path:
        """cache_root/<collection key>: needs the collection's metadata (IndexUnavailableError while Qdrant is down)."""
        if self._root is None:
            meta, config = self.index.load_meta(), self.index.config
            location = config.location
            if not location.startswith(("http", ":")):  # a directory: spelt as any process would spell it
                location = str(Path(location).resolve())
            build = f"{config.engine}|{location}|{self.index.name}|{meta.get('built_at')}|{meta.get('corpus_hash')}"
            self._root = self.cache_root / hashlib.sha256(build.encode()).hexdigest()[:16]
        return self._root

    def record(self) -> dict:
        return dict(self.index.load_meta(force=True).get("adapted") or {})

    # -- reading -------------------------------------------------------------------------------------------------
    def current(self) -> Path | None:
        live = self.record().get("live")
        if not live:
            return None
        path = self.root / live["version"]
        if not self.complete(path, live["files"]):
            self.fetch(live, path)
            self.prune({live["version"], *(v["version"] for v in self.record().get("kept") or [])})
        return path

    def prune(self, versions: set[str]) -> None:
        """Local copies of versions the collection no longer keeps (a server may still serve one: it is loaded in
        memory, so its files can go)."""
        for path in self.root.glob("a*"):
            if path.is_dir() and path.name not in versions:
                shutil.rmtree(path, ignore_errors=True)

    def complete(self, path: Path, files: dict) -> bool:
        try:
            return (path / STAMP).read_text(encoding="utf-8") == stamp(files)
        except OSError:
            return False

    def fetch(self, live: dict, path: Path) -> None:
        """The live version's files from Qdrant into `path`, each checked against its sha256."""
        tmp = self.root / f".fetch-{secrets.token_hex(6)}"
        tmp.mkdir(parents=True)
        try:
            for name, info in live["files"].items():
                (tmp / name).write_bytes(self.read_file(live["version"], name, info))
            (tmp / STAMP).write_text(stamp(live["files"]), encoding="utf-8")
            self.settle(tmp, path, live["files"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def read_file(self, version: str, name: str, info: dict) -> bytes:
        ids = [chunk_id(version, name, i) for i in range(info["chunks"])]
        points = {p.id: p for p in self.index.call("adapted", lambda e: e.retrieve(self.index.meta_name, ids,
                                                                                    True, False))}
        if set(points) != set(ids):
            raise ValueError(f"adapted CMC {version} of {self.where}: {len(ids) - len(points)} part(s) of {name} "
                             "are missing")
        data = b"".join(base64.b64decode(points[i].payload["data"]) for i in ids)
        if hashlib.sha256(data).hexdigest() != info["sha256"]:
            raise ValueError(f"adapted CMC {version} of {self.where}: {name} does not match its sha256")
        return data

    def settle(self, tmp: Path, path: Path, files: dict) -> None:
        """Rename the checked copy into place; another process that got there first left a complete one."""
        for file in tmp.iterdir():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
        if path.exists() and not self.complete(path, files):
            shutil.rmtree(path, ignore_errors=True)  # a damaged copy (a crash of an older Sieve): fetched again
        try:
            os.rename(tmp, path)
        except OSError:
            if not self.complete(path, files):
                raise
        fsync_dir(path.parent)

    def owns(self, path: Path | None) -> bool:
        try:
            return path is not None and Path(path).parent == self.root
        except Exception:  # noqa: BLE001 - Qdrant down: the key is unknown, so nothing served is known to be ours
            return False

    # -- publishing ----------------------------------------------------------------------------------------------
    def new_work_dir(self) -> Path:
        path = self.root / f".tmp-{secrets.token_hex(6)}"
        path.mkdir(parents=True)
        return path

    def publish(self, work_dir: Path) -> Path:
        record = self.record()
        live, kept = record.get("live"), list(record.get("kept") or [])
        number = 1 + max([int(v["version"][1:]) for v in [live, *kept] if v] or [0])
        version = f"a{number:06d}"
        files = {file.name: self.write_file(version, file) for file in sorted(work_dir.iterdir()) if file.is_file()}
        update = {"adapted": {"live": {"version": version, "files": files}, "kept": [live] if live else []}}
        self.index.call("meta", lambda e: e.set_payload(self.index.meta_name, META_POINT, update))
        self.index.load_meta(force=True)
        for old in kept:  # beyond the previous one: no server may switch back to it
            ids = [chunk_id(old["version"], n, i) for n, info in old["files"].items() for i in range(info["chunks"])]
            self.index.call("adapted", lambda e, ids=ids: e.delete(self.index.meta_name, ids))
        (work_dir / STAMP).write_text(stamp(files), encoding="utf-8")
        final = self.root / version
        self.settle(work_dir, final, files)  # the publisher's own copy: served without a fetch
        return final

    def write_file(self, version: str, file: Path) -> dict:
        data = file.read_bytes()
        parts = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
        for i, part in enumerate(parts):
            point = NewPoint(chunk_id(version, file.name, i), {"_": [0.0]},
                             {"adapted": version, "file": file.name, "chunk": i,
                              "data": base64.b64encode(part).decode("ascii")})
            self.index.call("adapted", lambda e: e.upsert(self.index.meta_name, [point]))
        return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "chunks": len(parts)}
