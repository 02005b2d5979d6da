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

On an Intel or AMD Zen 3 or later CPU server a batch of 2 or more goes to torch's matrix product and top-k over the
segment's memory map (index/device_flat.py, SIEVE_FLAT_SEARCH_ON_DEVICE; other CPUs keep FAISS: service/runtime.py):
0.52-0.75x FAISS's CPU per query for batches of 2-32 on the Intel Xeon host of the eleventh session, 0.67-0.80x on the
AMD Zen 5 host of the sixteenth, 0.73-0.97x on the AMD Zen 3 host of the seventeenth; on Zen 4 more than FAISS's
AVX-512 kernel, but a whole /search 0.87-0.93x (the twenty-eighth: the candidates' scores read from it); one query alone
stays with FAISS's per-query kernel (torch 1.1x it). The settings below then apply to a lone query, to other CPUs and
to servers that turned that off.

FAISS's exact search (`faiss.knn`) takes its matrix-product (BLAS) kernel when queries x rows reach a process-wide
threshold (128,000 in faiss-cpu 1.13-1.15: for SciFact, 25 queries); below it, a per-query kernel. On CPU the
matrix product pays from about BLAS_MIN_BATCH queries and costs twice the per-query kernel for one query: the
runner's thread (the only one that searches while a server batches) sets the threshold for each group it searches,
so a smaller group keeps FAISS's own choice.

**The search rides with the query's encoding** where it can: a first stage that will search with the bi-encoder's
query vector says so before the query is encoded (`DenseSearch.want`), the query encoder's runner searches each
batch it has just encoded (`encode_then_search`) and hands the request its vector and its candidates together. A
request then waits on one runner instead of two (one hand-off between threads less): on the 2-core Zen 4 host of the
twelfth session a zero-cost /search took 0.89x the server CPU of searching in a runner of its own (2.01 against 2.27
ms, medians of 4 interleaved rounds, the same kernel on both sides; RESULTS.md "Issue 32, twelfth session"). The
separate runner remains for a vector that did not come from the encoder (the embedding cache) and for a search that
failed inside the encoder's runner (tried again on its own, so its error, if any, is the request's own).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

log = logging.getLogger("sieve.dense")

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


def search_batch(items: Sequence[tuple[Any, np.ndarray, int]]
                 ) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]]:
    """items: (index, query vector (d,) float32, k) -> (item, (scores (k',), rows (k',), every)) pairs, k' = min(k,
    size), one search per (index version, k) group, each group answered as soon as it is searched
    (pipeline/batching.py). `every`: the query's score for every row ((size,) float32) where the index's search
    computed them all anyway (index/search_index.py `search_scored`), else None. A group whose search fails does
    not fail the others: its error reaches its own requests once the rest are answered."""
    faiss_one_thread()
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (index, _, k) in enumerate(items):
        groups.setdefault((id(index), k), []).append(i)
    failed: BaseException | None = None
    for (_, k), members in groups.items():
        index = items[members[0]][0]
        blas_kernel(len(members) >= BLAS_MIN_BATCH)
        try:
            queries = np.stack([items[i][1] for i in members])  # (B, d)
            if hasattr(index, "search_scored"):
                scores, rows, every = index.search_scored(queries, k)  # (B, k'), (B, k'), (B, size) or None
            else:
                (scores, rows), every = index.search(queries, k), None
        except Exception as exc:  # noqa: BLE001 - raised below, to this group's requests only
            failed = failed or exc
            continue
        for b, i in enumerate(members):  # each query's row of scores copied: no request holds the batch's matrix
            yield i, (scores[b], rows[b], None if every is None else every[b].copy())
    if failed is not None:
        raise failed


@dataclass(frozen=True)
class DenseWant:
    """A first stage's vector search, asked for before the query is encoded: `index` (the request's version), `k`."""
    index: Any
    k: int


@dataclass(frozen=True)
class DenseHits:
    """The top k of `want` for one encoded query, the wall milliseconds its batch's searches took, and the query's
    score for every row where the search computed them all (search_batch's `every`), else None."""
    want: DenseWant
    scores: np.ndarray  # (k',)
    rows: np.ndarray  # (k',)
    every: np.ndarray | None  # (size,)
    ms: float


def encode_then_search(tower, items: Sequence[Any]) -> list[tuple[Any, int, DenseHits | None]]:
    """A query encoder runner's compute: items are query texts, or (text, DenseWant) for a query whose first stage
    searches with this vector. Each item gets (vector, token count, DenseHits or None): None where nothing was
    asked, and where the search failed (the request then searches on its own and meets the error there)."""
    texts = [item if isinstance(item, str) else item[0] for item in items]
    encoded = tower.encode_queries_counted(texts)
    asked = [(n, item[1]) for n, item in enumerate(items) if not isinstance(item, str)]
    found: dict[int, tuple] = {}  # item -> (want, scores, rows, every)
    started = time.perf_counter()
    if asked:
        searches = [(want.index, encoded[n][0].float().cpu().numpy(), want.k) for n, want in asked]
        try:
            for j, (scores, rows, every) in search_batch(searches):
                found[asked[j][0]] = (asked[j][1], scores, rows, every)
        except Exception:  # noqa: BLE001 - those requests search again on their own and get the error there
            log.debug("a vector search inside the query encoder's batch failed", exc_info=True)
    ms = (time.perf_counter() - started) * 1000
    return [(vector, count, DenseHits(*found[n], ms) if n in found else None)
            for n, (vector, count) in enumerate(encoded)]


def search_dense(dense, index, vector: np.ndarray, k: int, state) -> tuple[np.ndarray, np.ndarray]:
    """One query vector's top k (scores, rows), 1-D: the candidates found with the query's encoding when they are
    this search's (`state.dense_hits`), else through `dense` (a DenseSearch) when given, else the index alone."""
    return search_dense_scored(dense, index, vector, k, state)[:2]


def search_dense_scored(dense, index, vector: np.ndarray, k: int, state
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """search_dense(), and the query's score for every row ((size,)) where the search computed them all (a batch
    searched by torch's matrix product: search_batch's `every`), else None."""
    hits = state.dense_hits
    if hits is not None and hits.want.index is index and hits.want.k == k:
        state.dense_hits = None
        return hits.scores, hits.rows, hits.every
    if dense is not None:
        return dense(index, vector, k, state)
    scores, rows = index.search(vector[None, :], k)
    return scores[0], rows[0], None


class DenseSearch:
    """`search(index, vector, k, state)` -> (scores, rows, every) for a first stage: through the shared runner when
    batching is on, else the index's own search. `wait(future, state)` is the Searcher's bounded wait (never a
    thread held for good)."""

    def __init__(self, runners, wait, with_encoding: bool = True):
        """`with_encoding`: the search may ride with the query's encoding (`want`)."""
        self.runners, self.wait, self.with_encoding = runners, wait, with_encoding

    def want(self, index, k: int) -> DenseWant | None:
        """What the query encoder's runner should search once it has the vector; None when batching is off (each
        request then encodes and searches alone, as before) or searches do not ride with encodings."""
        return DenseWant(index, k) if self.with_encoding and self.runners.config.enabled else None

    def __call__(self, index, vector: np.ndarray, k: int, state) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(scores, rows, every): search_batch's answer for this one query."""
        if not self.runners.config.enabled:
            return search_dense_scored(None, index, vector, k, state)
        future = self.runners.get(KEY, search_batch, max_wait_ms=0.0).submit((index, vector, k))
        return self.wait(future, state, "the vector search gave no candidates")
