"""The manifest: what built an index version, and the checks made on load."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import IndexFormatError, IndexMismatchError

FORMAT_VERSION = 2  # 2: segments + tombstones (index/segments.py); 1 was one monolithic directory
DTYPES = ("float32", "float16")
FAISS_KINDS = ("auto", "flat", "ivf", "hnsw")  # auto: exact below ann_min_rows rows per segment, IVF above
REBUILD_HINT = ("rebuild with `sieve index build` or point SIEVE_MODEL_PATH "
                "at the model that built it")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Manifest:
    format_version: int
    model_name: str
    model_hash: str
    dim: int
    count: int
    dtype: str
    faiss_kind: str
    faiss_params: dict[str, Any]
    corpus_hash: str
    created: str
    version: int
    # extra embedding stores: name -> {"model_name", "model_hash", "dim"}
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the BM25 part (index/lexical.py): {"engine", "language", "k1", "b"}; empty = this version has none
    lexical: dict[str, Any] = field(default_factory=dict)
    # the segments of this version, oldest first: [{"name": "v000003", "rows": n, "ann": "flat"|"ivf"|"hnsw"}];
    # each lives in DIR/versions/<name>/; rows are numbered across them in this order (index/segments.py)
    segments: list[dict[str, Any]] = field(default_factory=list)
    deleted: int = 0  # tombstoned rows across the segments (listed in this version's deleted.npy)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "manifest") -> "Manifest":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise IndexFormatError(f"{source} is not valid JSON ({e.msg}); "
                                   "rebuild the index with `sieve index build`") from None
        if not isinstance(data, dict):
            raise IndexFormatError(f"{source} must be a JSON object")
        _check_format_version(data.get("format_version"), source)
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names - {"stores", "lexical", "segments", "deleted"} if n not in data)
        if missing:
            raise IndexFormatError(f"{source} lacks field(s) {', '.join(missing)}; "
                                   "rebuild the index with `sieve index build`")
        return cls(**{k: v for k, v in data.items() if k in names})


def _check_format_version(value: Any, source: str) -> None:
    if value != FORMAT_VERSION:
        raise IndexFormatError(
            f"{source} has format_version {value!r}, but this Sieve reads only "
            f"format_version {FORMAT_VERSION}; rebuild the index with `sieve index build`")


def read_manifest(version_dir: Path) -> Manifest:
    path = version_dir / "manifest.json"
    return Manifest.from_json(path.read_text(encoding="utf-8"), source=str(path))


def write_manifest(version_dir: Path, manifest: Manifest) -> None:
    (version_dir / "manifest.json").write_text(manifest.to_json(), encoding="utf-8")


def _short(h: str) -> str:
    return f"{h[:12]}…" if len(h) > 12 else h


def check_manifest(manifest: Manifest, model_name: str | None, model_hash: str | None,
                   dim: int | None, *, index_dir: str | Path | None = None) -> None:
    """Raise IndexMismatchError naming every field that differs; None skips a field."""
    _check_format_version(manifest.format_version, "index manifest")
    wanted = {"model_name": model_name, "model_hash": model_hash, "dim": dim}
    differing = [k for k, v in wanted.items()
                 if v is not None and v != getattr(manifest, k)]
    if not differing:
        return
    where = f"index at {index_dir}" if index_dir is not None else "index"
    built = _describe(manifest.model_name, manifest.model_hash, manifest.dim)
    configured = _describe(model_name if model_name is not None else manifest.model_name,
                           model_hash if model_hash is not None else manifest.model_hash,
                           dim if dim is not None else manifest.dim)
    raise IndexMismatchError(
        f"{where} was built with model {built}, but the service is configured with "
        f"{configured}; differing: {', '.join(differing)}; {REBUILD_HINT}")


def _describe(name: str, weights_hash: str, dim: int) -> str:
    return f"{name!r} (weights sha256 {_short(weights_hash)}, dim {dim})"
