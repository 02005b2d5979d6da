"""Exact maximum inner-product search of a flat segment on the serving device (issue 32).

A flat segment's vectors are copied once to the device when the segment is opened, and a search is one matmul and
one top-k there: fp16 on CUDA (half the memory and the tensor cores; scores within ~1e-3 of fp32 for unit vectors,
so two hits that close may swap), fp32 on the CPU (what the tests compare against FAISS's exact search). On an
Intel CPU or an AMD Zen 3 or later (the kinds the server puts here: service/runtime.py `torch_product_pays`) a
segment's float32 memory map is used as it is (a tensor over the same pages: no copy, no extra memory), and a batch of
2 or more queries is searched with torch's matrix product and top-k, which costs 0.5-0.8x the CPU per query of FAISS's
exact search on Intel, Zen 3 and Zen 5 (on Zen 4 the product alone costs more, but the whole /search less); one query
alone goes to FAISS's own kernel (torch: 1.0-1.1x) (segments.py; benchmarks/dense_batch.py on SciFact's 5,183 x 384
vectors, RESULTS.md "Issue 32, eleventh session", "sixteenth session" and "twenty-eighth session"). On a CPU with
native bf16 products a bfloat16 copy in RAM is searched instead, every batch size: 0.40-0.79x the float32 product's
CPU per query from 2 queries on Zen 5, scores within ~2.5e-3 (SIEVE_FLAT_SEARCH_PRECISION; RESULTS.md, "forty-third
session").

torch is imported here only when a segment is put on a device: `sieve.index` stays importable without it.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np

from .storage import row_chunks

_QUERY_CHUNK = 256  # queries per matmul: bounds the (B, N) score matrix on the device


def flat_backend(device: str, faiss_gpu: bool) -> str:
    """'faiss-gpu' where FAISS has a GPU and it may be used on this CUDA device, else 'torch'."""
    if faiss_gpu and device.startswith("cuda"):
        from .vectors import gpu_count

        if gpu_count() > 0:
            return "faiss-gpu"
    return "torch"


class DeviceFlat:
    """The (rows, d) vectors of one flat segment resident on `device`; search() = exact inner-product top-k."""

    def __init__(self, vectors, device: str, faiss_gpu: bool = False, cpu_dtype: str = "fp32"):
        """`cpu_dtype` 'bf16': on the CPU, search a bfloat16 copy of the vectors (CPUs with native bf16 products:
        service/runtime.py `flat_search_precision`) instead of the float32 memory map."""
        self.device = device
        self.backend = flat_backend(device, faiss_gpu)
        self.rows, self.dim = int(vectors.shape[0]), int(vectors.shape[1])
        self.lock = threading.Lock()  # FAISS GPU indexes do not allow concurrent searches (torch's path needs none)
        if self.backend == "faiss-gpu":
            self.index = _faiss_gpu_flat(vectors, device)
            self.vectors = None
            self.dtype = "fp32"
        else:
            self.index = None
            bf16 = device == "cpu" and cpu_dtype == "bf16"
            self.vectors = _to_device(vectors, device, bf16)  # (N, d)
            self.dtype = "fp16" if device.startswith("cuda") else ("bf16" if bf16 else "fp32")

    @property
    def takes_single_queries(self) -> bool:
        """Whether one query alone is searched here too: on a GPU, and on a bf16 copy (a query then gets the ranking
        it gets in a batch, not FAISS's float32 one: identical for 256 of 256 SciFact queries at batches of 1-16 on a
        Zen 5 host); one query over the CPU's float32 map goes to FAISS's own kernel."""
        return self.device != "cpu" or self.dtype == "bf16"

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (B, k) float32, rows (B, k) int64), best first; k is at most the segment's rows."""
        return self.search_scored(q, k)[:2]

    def search_scored(self, q: np.ndarray, k: int, keep: bool = False
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """search(), and with `keep` on the CPU every row's score too ((B, rows) float32, the matrix the top k was
        taken from; None on a GPU or through FAISS): a caller that needs other rows' inner products with the
        query looks them up there instead of reading their vectors (pipeline/first_stage.py)."""
        k = min(k, self.rows)
        if self.index is not None:
            with self.lock:
                return (*self.index.search(np.ascontiguousarray(q, dtype=np.float32), k), None)
        import torch

        out_s, out_r, kept = [], [], []
        with torch.inference_mode():
            for start in range(0, len(q), _QUERY_CHUNK):
                part = torch.from_numpy(np.ascontiguousarray(q[start:start + _QUERY_CHUNK], dtype=np.float32))
                scores = part.to(self.vectors.device, self.vectors.dtype) @ self.vectors.T  # (b, N)
                if scores.device.type == "cpu":  # numpy's partition then a sort of the k: 0.4-0.6x torch.topk's CPU
                    scores = scores.float()  # a bf16 copy's scores in float32 (float32's: no copy)
                    top_s, top_r = top_k(scores.numpy(), k)  # per query from 4 queries (RESULTS.md, issue 32, s14)
                    if keep:
                        kept.append(scores.numpy())
                else:
                    top = torch.topk(scores, k, dim=1, largest=True, sorted=True)
                    top_s, top_r = top.values.float().cpu().numpy(), top.indices.cpu().numpy()
                out_s.append(top_s)
                out_r.append(top_r.astype(np.int64, copy=False))
        full = (kept[0] if len(kept) == 1 else np.concatenate(kept)) if keep and kept else None
        return np.concatenate(out_s), np.concatenate(out_r), full

    def nbytes(self) -> int:
        return 0 if self.vectors is None else self.vectors.numel() * self.vectors.element_size()


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, N) scores -> the k best of each row, best first: (scores (B, k), columns (B, k)); ties at the k-th value
    are taken in no particular order (as torch.topk and FAISS take them)."""
    neg = -scores
    part = np.argpartition(neg, k - 1, axis=1)[:, :k]  # (B, k) the k best, unordered
    worse = np.take_along_axis(neg, part, axis=1)
    order = np.argsort(worse, axis=1, kind="stable")  # (B, k) best first
    return -np.take_along_axis(worse, order, axis=1), np.take_along_axis(part, order, axis=1)


def _to_device(vectors, device: str, bf16: bool = False):
    import torch

    if device == "cpu" and not bf16 and isinstance(vectors, np.ndarray) and vectors.dtype == np.float32 \
            and vectors.flags.c_contiguous:
        with warnings.catch_warnings():  # a read-only memory map: torch warns that writes would be undefined; none are made
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(vectors)  # (N, d) over the same memory: no copy
    dtype = torch.float16 if device.startswith("cuda") else (torch.bfloat16 if bf16 else torch.float32)
    out = torch.empty((int(vectors.shape[0]), int(vectors.shape[1])), dtype=dtype, device=device)
    start = 0
    for block in row_chunks(vectors):  # block by block: a memory-mapped segment is never read whole into RAM
        block = np.array(block, dtype=np.float32)  # a copy: torch does not take read-only (memory-mapped) arrays
        out[start:start + len(block)] = torch.from_numpy(block).to(device, dtype)
        start += len(block)
    return out


def _faiss_gpu_flat(vectors, device: str):
    import faiss

    gpu = int(device.split(":")[1]) if ":" in device else 0
    resources = faiss.StandardGpuResources()
    config = faiss.GpuIndexFlatConfig()
    config.device = gpu
    index = faiss.GpuIndexFlatIP(resources, int(vectors.shape[1]), config)
    for block in row_chunks(vectors):
        index.add(np.ascontiguousarray(block, dtype=np.float32))
    index.referenced_objects = [resources]  # the index does not own its resources: keep them alive with it
    return index
