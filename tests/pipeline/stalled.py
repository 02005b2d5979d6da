"""A runner whose futures never complete (a stuck batcher), for the tests of the bounded waits
(test_encode_deadline.py, test_dense_batch.py); it records what it was given."""
from __future__ import annotations

from concurrent.futures import Future


class Stalled:
    def __init__(self):
        self.futures: list[Future] = []

    def submit(self, item) -> Future:
        self.futures.append(Future())
        return self.futures[-1]
