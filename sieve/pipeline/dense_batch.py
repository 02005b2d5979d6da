"""The first stage's vector search batched across concurrent requests (the `be` and `hybrid` retrievers).

One query vector searched alone is a matrix-vector product: it reads every stored vector (8 MB for SciFact's 5,183
x 384 floats) to score one query, so it is bound by memory, not arithmetic. Searched together, B queries read the
vectors once (a matrix product) and each costs a fraction: on a 2-core Intel Xeon, FAISS's exact top-512 over
SciFact took about 470 us of CPU for one query alone and 200 us per query in a batch of 8
(benchmarks/dense_batch.py).
On a GPU the stored vectors stay on the device (index/device_flat.py) and a batch is one kernel launch, not B.

A runner (pipeline/batching.py) with no extra wait takes whatever requests have queued while it searched the last
batch, so a lone request pays only the hand-off and a loaded server gets batches of the size its load makes.
Requests of one batch are grouped by index version and k, so each gets exactly the list a search of its own would
return, up to the kernel: FAISS's two kernels (and torch's) order equal scores alike and differ in a score's last
bits (up to 3e-6 seen), so two candidates whose scores are that close may trade places
(tests/pipeline/test_dense_batch.py).

On a CPU server a batch of 2 or more goes to torch's matrix product and top-k over the segment's memory map
(index/device_flat.py, SIEVE_FLAT_SEARCH_ON_DEVICE): 0.52-0.75x FAISS's CPU per query for batches of 2-32 on the
Intel Xeon host of the eleventh session; one query alone stays with FAISS's per-query kernel (torch 1.1x it). The
settings below then apply to a lone query and to servers that turned that off.

FAISS's exact search (`faiss.knn`) takes its matrix-product (BLAS) kernel when queries x rows reach a process-wide
threshold (128,000 in faiss-cpu 1.13-1.15: for SciFact, 25 queries); below it, a per-query kernel. On CPU the
matrix product pays from about BLAS_MIN_BATCH queries and costs twice the per-query kernel for one query: the
runner's thread (the only one that searches while a server batches) sets the threshold for each group it searches,
so a smaller group keeps FAISS's own choice.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence

import numpy as np

KEY = "dense"  # the runner's key: one runner for every index version (items carry theirs)
BLAS_MIN_BATCH = 4  # queries from which FAISS's matrix-product kernel is cheaper per query on CPU (measured above)
_threshold: dict[str, int] = {}  # "default": FAISS's own, read before the first change; "set": the last one set here
_per_thread = threading.local()


def blas_kernel(on: bool) -> None:
    """FAISS's exact search takes its matrix-product kernel for any batch (on) or as FAISS decides (off); set only
    when it changes (each call into FAISS hands the interpreter lock back and forth)."""
    import faiss

    if "default" not in _threshold:
        _threshold["default"] = faiss.cvar.distance_compute_blas_threshold
    want = 1 if on else _threshold["default"]
    if _threshold.get("set") != want:
        faiss.cvar.distance_compute_blas_threshold = _threshold["set"] = want


def faiss_one_thread() -> None:
    """FAISS's OpenMP (and the OpenMP BLAS it calls) on one thread in the calling thread: OpenMP's thread count is
    per thread, so the limit set at start-up (service/components.py) does not reach a runner's thread, where
    a team per batch would spin on cores the other requests need. Once per thread."""
    if getattr(_per_thread, "one_thread", False):
        return
    import faiss

    faiss.omp_set_num_threads(1)
    _per_thread.one_thread = True


def search_batch(items: Sequence[tuple[Any, np.ndarray, int]]) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray]]]:
    """items: (index, query vector (d,) float32, k) -> (item, (scores (k',), rows (k',))) pairs, k' = min(k, size),
    one `index.search` per (index version, k) group, each group answered as soon as it is searched
    (pipeline/batching.py). A group whose search fails does not fail the others: its error reaches its own
    requests once the rest are answered."""
    faiss_one_thread()
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (index, _, k) in enumerate(items):
        groups.setdefault((id(index), k), []).append(i)
    failed: BaseException | None = None
    for (_, k), members in groups.items():
        index = items[members[0]][0]
        blas_kernel(len(members) >= BLAS_MIN_BATCH)
        try:
            scores, rows = index.search(np.stack([items[i][1] for i in members]), k)  # (B, k')
        except Exception as exc:  # noqa: BLE001 - raised below, to this group's requests only
            failed = failed or exc
            continue
        for b, i in enumerate(members):
            yield i, (scores[b], rows[b])
    if failed is not None:
        raise failed


def search_dense(dense, index, vector: np.ndarray, k: int, state) -> tuple[np.ndarray, np.ndarray]:
    """One query vector's top k (scores, rows), 1-D: through `dense` (a DenseSearch) when given, else the index
    alone."""
    if dense is not None:
        return dense(index, vector, k, state)
    scores, rows = index.search(vector[None, :], k)
    return scores[0], rows[0]


class DenseSearch:
    """`search(index, vector, k, state)` for a first stage: through the shared runner when batching is on, else
    the index's own search. `wait(future, state)` is the Searcher's bounded wait (never a thread held for good)."""

    def __init__(self, runners, wait):
        self.runners, self.wait = runners, wait

    def __call__(self, index, vector: np.ndarray, k: int, state) -> tuple[np.ndarray, np.ndarray]:
        if not self.runners.config.enabled:
            return search_dense(None, index, vector, k, state)
        future = self.runners.get(KEY, search_batch, max_wait_ms=0.0).submit((index, vector, k))
        return self.wait(future, state, "the vector search gave no candidates")
