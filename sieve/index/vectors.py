"""FAISS index construction, search-time parameters and device placement.

All indexes use inner product: encoders emit L2-normalised vectors, so this
is cosine similarity.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import faiss
import numpy as np

from .manifest import FAISS_KINDS

_ALLOWED_PARAMS = {"auto": {"ann_min_rows", "nlist"}, "flat": set(), "ivf": {"nlist", "ann_min_rows"},
                   "hnsw": {"M", "ef_construction", "ann_min_rows"}}
HNSW_DEFAULTS = {"M": 32, "ef_construction": 200}
# "auto": a segment of at least this many rows gets an IVF index, smaller ones are searched exactly (SIEVE_ANN_MIN_ROWS;
# chosen from benchmarks/index_scale.py, see docs/index.md)
DEFAULT_ANN_MIN_ROWS = 50_000
# "ivf"/"hnsw" chosen by hand: the build's segment always gets it, later segments from this size on (smaller ones
# are faster and exact with brute force)
EXPLICIT_ANN_MIN_ROWS = 1_000


def default_nlist(n: int) -> int:
    # ~4*sqrt(N) lists, but FAISS wants >= 39 training points per list.
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def resolve_params(kind: str, params: dict[str, Any] | None, n: int) -> dict[str, Any]:
    """Validate `params` for `kind` and fill defaults; the result goes into the manifest."""
    if kind not in FAISS_KINDS:
        raise ValueError(f"unknown faiss kind {kind!r}; allowed: {', '.join(FAISS_KINDS)}")
    params = dict(params or {})
    unknown = sorted(set(params) - _ALLOWED_PARAMS[kind])
    if unknown:
        allowed = ", ".join(sorted(_ALLOWED_PARAMS[kind])) or "none"
        raise ValueError(f"unknown faiss parameter(s) {', '.join(unknown)} for kind "
                         f"{kind!r}; allowed: {allowed}")
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"faiss parameter {key} must be a positive integer, got {value!r}")
    if kind == "auto":
        params.setdefault("ann_min_rows", DEFAULT_ANN_MIN_ROWS)
    elif kind == "ivf":
        params.setdefault("nlist", default_nlist(n))
    elif kind == "hnsw":
        params = {**HNSW_DEFAULTS, **params}
    return params


def segment_ann(kind: str, params: dict[str, Any], rows: int, whole: bool) -> str:
    """The search structure of a segment of `rows` rows ("flat" = exact); `whole`: it holds the whole index."""
    if kind == "flat":
        return "flat"
    if kind == "auto":
        return "ivf" if rows >= params.get("ann_min_rows", DEFAULT_ANN_MIN_ROWS) else "flat"
    return kind if whole or rows >= params.get("ann_min_rows", EXPLICIT_ANN_MIN_ROWS) else "flat"


def segment_params(kind: str, params: dict[str, Any], rows: int) -> dict[str, Any]:
    """FAISS parameters for one segment: nlist follows the segment's size unless set by hand."""
    out = {k: v for k, v in params.items() if k != "ann_min_rows"}
    if kind in ("auto", "ivf") and "nlist" not in params:
        out["nlist"] = auto_nlist(rows) if kind == "auto" else default_nlist(rows)
    return out


def auto_nlist(n: int) -> int:
    # ~sqrt(N) lists of ~sqrt(N) rows: at 1M rows, 1,000 lists; nprobe lists are scanned per query
    return max(1, min(int(math.sqrt(n)), n // 39))


def build_faiss(embeddings: np.ndarray, kind: str = "flat",
                params: dict[str, Any] | None = None) -> faiss.Index:
    """Build a CPU index over (N, d) float32 embeddings; row i gets label i."""
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"embeddings must be a non-empty (N, d) array, got shape {x.shape}")
    n, d = x.shape
    params = resolve_params(kind, params, n)
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind in ("ivf", "auto"):
        # After deletes N may fall below the recorded nlist; training needs N >= nlist.
        nlist = min(params["nlist"], n)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.max_points_per_centroid = 64  # k-means on a sample: at 1M rows the full set costs minutes, not recall
        index.train(x)
    else:
        index = faiss.IndexHNSWFlat(d, params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
    index.add(x)
    return index


def set_search_params(index: faiss.Index, nprobe: int, ef_search: int) -> None:
    """Apply search-time knobs to a CPU index (no-op for kinds without them)."""
    if nprobe < 1 or ef_search < 1:
        raise ValueError(f"nprobe and ef_search must be >= 1, got {nprobe}, {ef_search}")
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(nprobe, ivf.nlist)
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = ef_search


def gpu_count() -> int:
    # faiss-cpu builds may lack get_num_gpus or report 0; both mean "no GPU".
    get = getattr(faiss, "get_num_gpus", None)
    try:
        return int(get()) if get is not None else 0
    except Exception:
        return 0


def to_device(index: faiss.Index, use_gpu: bool) -> faiss.Index:
    """Move to GPU 0 when asked and possible, else return `index` itself.

    HNSW has no GPU implementation in FAISS, so it always stays on the CPU.
    """
    if not use_gpu or gpu_count() == 0 or isinstance(index, faiss.IndexHNSW):
        return index
    resources = faiss.StandardGpuResources()
    gpu_index = faiss.index_cpu_to_gpu(resources, 0, index)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and hasattr(gpu_index, "nprobe"):
        gpu_index.nprobe = ivf.nprobe  # keep the knob set by set_search_params
    # The index does not own the resources; keep them alive with it.
    gpu_index.referenced_objects = [resources]
    return gpu_index


def exact_top_k(queries: np.ndarray, blocks: Iterable[np.ndarray],
                k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k over row blocks (a fallback when an ANN index comes up short)."""
    b = len(queries)
    best_s = np.empty((b, 0), dtype=np.float32)
    best_r = np.empty((b, 0), dtype=np.int64)
    start = 0
    for block in blocks:
        scores = queries @ block.T
        rows = np.broadcast_to(np.arange(start, start + len(block), dtype=np.int64), scores.shape)
        best_s = np.concatenate([best_s, scores], axis=1)
        best_r = np.concatenate([best_r, rows], axis=1)
        if best_s.shape[1] > k:
            keep = np.argpartition(-best_s, k - 1, axis=1)[:, :k]
            best_s = np.take_along_axis(best_s, keep, axis=1)
            best_r = np.take_along_axis(best_r, keep, axis=1)
        start += len(block)
    order = np.argsort(-best_s, axis=1, kind="stable")
    return (np.take_along_axis(best_s, order, axis=1).astype(np.float32),
            np.take_along_axis(best_r, order, axis=1))
