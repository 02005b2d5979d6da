"""Dynamic micro-batching: requests submit work items from many threads and wait on futures; one worker thread per
model runs `compute(items)` over whatever has queued up (at most `max_size` items, waiting at most `max_wait_ms`
for more after the first, and only while company may come: `Batcher.others_may_come`, from the requests in flight
(`InFlight`, counted by the Searcher) and the last batch's size, so a lone request is not held back). Model work
therefore never runs on the event loop, and concurrent requests share forward passes. A waiter that gives up (its
deadline passed) cancels its future; a cancelled item that has not started is dropped before the forward pass, so
it costs nothing.

Replies as soon as each request is done: `compute` may return an iterator of (item index, result) pairs instead of
the list, yielding each item as soon as its own rows are scored (a stage's `compute_each`); the batcher answers
that item's waiter at once instead of when the whole merged batch is done. Every item must be yielded once.

`Direct` is the same interface without batching: each item is computed on its own in a thread pool (what the
service does with SIEVE_BATCHING=false, and the baseline of benchmarks/load.py).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

log = logging.getLogger("sieve.batching")

CLOSE_JOIN_S = 5.0  # Runners.close: the longest it waits for the batch threads to end
# items of many requests -> one result per item, in order; or (item index, result) pairs as items finish
Compute = Callable[[Sequence[Any]], Sequence[Any] | Iterator[tuple[int, Any]]]
OnBatch = Callable[[str, int], None]  # (model name, batch size) after each forward pass


@dataclass(frozen=True)
class BatchConfig:
    enabled: bool = True
    max_size: int = 32  # items (requests) per batch
    max_wait_ms: float = 2.0  # extra wait for more items after the first; 0 = take what is queued
    cmc_candidates: int = 16384  # CMC: batch size x longest candidate list, per forward pass
    ce_tokens: int = 8192  # cross-encoder: pairs x longest pair in tokens, per forward pass
    direct_workers: int = 64  # threads computing items one by one when batching is off


class InFlight:
    """How many requests are in a Searcher's pipeline now (`with in_flight:` around each): one of what a batcher
    reads to decide whether more items may still come (Batcher.others_may_come)."""

    def __init__(self):
        self.count = 0
        self.lock = threading.Lock()

    def __enter__(self) -> "InFlight":
        with self.lock:
            self.count += 1
        return self

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.count -= 1


class Batcher:
    def __init__(self, name: str, compute: Compute, max_size: int, max_wait_ms: float, on_batch: OnBatch | None = None,
                 on_start: Callable[[], None] | None = None, in_flight: Callable[[], int] | None = None):
        """`on_start`: called once in the worker thread before its first batch (service/pinning.py forward_team).
        `in_flight`: how many requests may still submit items (None: wait max_wait_ms whatever the load)."""
        self.on_start = on_start
        self.in_flight = in_flight
        self.last_size = 0  # items in the last batch
        self.name = name
        self.compute = compute
        self.max_size = max_size
        self.max_wait_s = max_wait_ms / 1000
        self.on_batch = on_batch
        # queue.Queue, not SimpleQueue: CPython's SimpleQueue.get(timeout=t) can block until the next put when the
        # thread is preempted inside the call past its deadline (a negative remaining wait means "forever" there),
        # which left a request waiting on an idle batcher (tests/pipeline/test_timed_queues.py)
        self.queue: queue.Queue = queue.Queue()
        self.closed = False
        self.thread = threading.Thread(target=self.loop, name=f"batch-{name}", daemon=True)
        self.thread.start()

    def submit(self, item: Any) -> Future:
        if self.closed:
            raise RuntimeError(f"batcher {self.name} is closed")
        future: Future = Future()
        self.queue.put((item, future))
        return future

    def close(self) -> None:
        self.closed = True
        self.queue.put(None)

    def join(self, timeout_s: float) -> None:
        """Until the worker thread has ended (after close), at most `timeout_s`."""
        if self.thread is not threading.current_thread():
            self.thread.join(timeout_s)

    def others_may_come(self, batched: int) -> bool:
        """Whether to wait for more items in a batch of `batched`: while a request in flight has none in it (a
        bound, not a count of this runner's callers: a request past this stage or in another counts too), or while it
        holds fewer than the last batch: requests that shared a forward pass finish together and come back together,
        the second a moment behind the first, before the server counts it (so two clients in step keep sharing)."""
        return self.in_flight is None or self.last_size > batched or self.in_flight() > batched

    def collect(self, first) -> list:
        batch = [first]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_size:
            try:
                timeout = deadline - time.monotonic()
                wait = timeout > 0 and self.others_may_come(len(batch))
                entry = self.queue.get(timeout=timeout) if wait else self.queue.get_nowait()
            except queue.Empty:
                break
            if entry is None:
                self.queue.put(None)  # close after this batch
                break
            batch.append(entry)
        return batch

    def loop(self) -> None:
        if self.on_start is not None:
            self.on_start()
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = self.collect(first)
            self.last_size = len(batch)
            live = [(item, fut) for item, fut in batch if fut.set_running_or_notify_cancel()]
            if live:
                self.run(live)

    def run(self, live: list) -> None:
        answered = [False] * len(live)
        try:
            for i, result in as_pairs(self.compute([item for item, _ in live]), len(live)):
                assert not answered[i], f"{self.name}: item {i} answered twice"
                answered[i] = True
                live[i][1].set_result(result)  # its waiter goes on now, while later rows are still being scored
            assert all(answered), f"{self.name}: {answered.count(False)} of {len(live)} items got no result"
        except BaseException as exc:  # noqa: BLE001 - every waiter still waiting gets the error, the worker lives on
            log.exception("batch of %d on %s failed", len(live), self.name)
            for (_, fut), done in zip(live, answered):
                if not done:
                    fut.set_exception(exc)
            return
        if self.on_batch:
            self.on_batch(self.name, len(live))


def as_pairs(output: Sequence[Any] | Iterable[tuple[int, Any]], n: int) -> Iterable[tuple[int, Any]]:
    """(item index, result) pairs from either form of a compute's output."""
    if isinstance(output, (list, tuple)):
        assert len(output) == n, f"{len(output)} results for {n} items"
        return enumerate(output)
    return output


def in_order(output: Sequence[Any] | Iterable[tuple[int, Any]], n: int) -> list[Any]:
    """One result per item, in item order, from either form of a compute's output."""
    results: list[Any] = [None] * n
    for i, result in as_pairs(output, n):
        results[i] = result
    return results


class Direct:
    """No batching: each item is its own forward pass, in a shared thread pool."""

    def __init__(self, name: str, compute: Compute, pool: ThreadPoolExecutor, on_batch: OnBatch | None = None):
        self.name = name
        self.compute = compute
        self.pool = pool
        self.on_batch = on_batch

    def one(self, item: Any) -> Any:
        result = in_order(self.compute([item]), 1)[0]
        if self.on_batch:
            self.on_batch(self.name, 1)
        return result

    def submit(self, item: Any) -> Future:
        return self.pool.submit(self.one, item)

    def close(self) -> None:
        pass


class Runners:
    """One runner per model (keyed by the stage's batch_key), created on first use."""

    def __init__(self, config: BatchConfig = BatchConfig()):
        self.config = config
        self.on_batch: OnBatch | None = None
        # called once in each thread that computes items (batchers, the pool), before its first: set before the first
        # request (the service: service/pinning.py forward_team)
        self.on_thread_start: Callable[[], None] | None = None
        self.runners: dict[str, Batcher | Direct] = {}
        self.in_flight = InFlight()  # the Searcher's requests (pipeline/searcher.py): how long a batch waits for more
        # the server's requests admitted and not yet answered (service/app.py: protection.Admission's count), set
        # before the first request
        self.admitted: Callable[[], int] | None = None
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=config.direct_workers, thread_name_prefix="model",
                                       initializer=self.thread_started)

    def get(self, key: str, compute: Compute, max_wait_ms: float | None = None) -> Batcher | Direct:
        """`max_wait_ms`: this runner's wait for more items (None: the config's; 0: what queued meanwhile)."""
        runner = self.runners.get(key)
        if runner is None:
            with self.lock:
                runner = self.runners.get(key)
                if runner is None:
                    runner = self.runners[key] = self.make(key, compute, max_wait_ms)
        return runner

    def requests_in_flight(self) -> int:
        """What a batch waits for (Batcher.others_may_come): the server's admitted requests when it counts them
        (from the moment a request's body is read, so one right behind another already counts when the first
        reaches a batcher: two clients in step keep sharing forward passes), else those inside the Searcher."""
        admitted = self.admitted
        return self.in_flight.count if admitted is None else max(self.in_flight.count, admitted())

    def thread_started(self) -> None:
        if self.on_thread_start is not None:
            self.on_thread_start()

    def make(self, key: str, compute: Compute, max_wait_ms: float | None = None) -> Batcher | Direct:
        hook = lambda name, n: self.on_batch and self.on_batch(name, n)  # noqa: E731 - read at call time
        if self.config.enabled:
            wait_ms = self.config.max_wait_ms if max_wait_ms is None else max_wait_ms
            return Batcher(key, compute, self.config.max_size, wait_ms, hook, self.thread_started,
                           self.requests_in_flight)
        return Direct(key, compute, self.pool, hook)

    def close(self, join_s: float = CLOSE_JOIN_S) -> None:
        """Stop every runner and wait (at most `join_s` in all) for the batch threads to end: a thread still ending
        while the interpreter shuts down frees its last tensors there, and torch's deallocator, releasing the
        interpreter lock at that moment, aborts the process ("terminate called without an active exception": seen
        once in 20 runs of `sieve feedback import`)."""
        for runner in self.runners.values():
            runner.close()
        deadline = time.monotonic() + join_s
        for runner in self.runners.values():
            if isinstance(runner, Batcher):
                runner.join(max(0.0, deadline - time.monotonic()))
        self.pool.shutdown(wait=False, cancel_futures=True)
