"""A circuit breaker for a remote stage: after `failures_to_open` failed calls in a row it opens, and calls are
refused at once (no network) for `open_s` seconds; then one probe call is let through (half-open): its success
closes the breaker, its failure opens it for another `open_s`. Thread-safe; one per remote endpoint."""
from __future__ import annotations

import threading
import time
from typing import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    def __init__(self, failures_to_open: int, open_s: float, clock: Callable[[], float] = time.monotonic):
        assert failures_to_open >= 1 and open_s >= 0
        self.failures_to_open = failures_to_open
        self.open_s = open_s
        self.clock = clock
        self.lock = threading.Lock()
        self.failures = 0  # consecutive failed calls
        self.opened_at: float | None = None  # None = closed
        self.probing = False  # a half-open probe is in flight
        self.opened_total = 0  # times it opened since start

    @property
    def state(self) -> str:
        with self.lock:
            return self._state()

    def _state(self) -> str:
        if self.opened_at is None:
            return CLOSED
        return HALF_OPEN if self.clock() - self.opened_at >= self.open_s else OPEN

    def allow(self) -> bool:
        """Whether a call may go out now. In half-open, only the first caller (the probe) is let through."""
        with self.lock:
            state = self._state()
            if state == CLOSED:
                return True
            if state == HALF_OPEN and not self.probing:
                self.probing = True
                return True
            return False

    def success(self) -> None:
        with self.lock:
            self.failures, self.opened_at, self.probing = 0, None, False

    def failure(self) -> None:
        with self.lock:
            self.failures += 1
            probe_failed = self.probing
            self.probing = False
            if probe_failed or (self.opened_at is None and self.failures >= self.failures_to_open):
                self.opened_at = self.clock()
                self.opened_total += 1

    def status(self) -> dict:
        with self.lock:
            state = self._state()
            retry_in = None if state != OPEN else max(0.0, self.open_s - (self.clock() - self.opened_at))
            return {"state": state, "consecutive_failures": self.failures, "opened_total": self.opened_total,
                    "retry_in_s": retry_in}
