"""uvicorn's multiprocess supervisor with what Sieve's workers need around it (service/workers.py): a worker that
dies leaves no live gauges or readiness marker behind (prometheus-client's mark_process_dead), and on shutdown the
supervisor lets go of the listening socket first, so new connections are refused while the workers drain."""
from __future__ import annotations

import logging
from pathlib import Path

from uvicorn.supervisors.multiprocess import Multiprocess

from sieve.service.workers import READY_SUFFIX

log = logging.getLogger("sieve.workers")


class Supervisor(Multiprocess):
    def __init__(self, config, sockets, metrics_dir: Path):
        super().__init__(config, sockets)
        self.metrics_dir = metrics_dir

    def keep_subprocess_alive(self) -> None:
        before = {p.pid: p for p in self.processes}
        super().keep_subprocess_alive()
        now = {p.pid for p in self.processes}
        for pid, process in before.items():
            if pid not in now:
                self.forget(pid)
                log.warning("worker %s exited (code %s); a new worker is starting", pid, process.exitcode)

    def forget(self, pid: int) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, str(self.metrics_dir))  # its live* gauges (in flight, index size, ...)
        (self.metrics_dir / f"worker-{pid}{READY_SUFFIX}").unlink(missing_ok=True)

    def terminate_all(self) -> None:
        for sock in self.sockets:  # the workers hold their own copies until each has stopped accepting
            sock.close()
        super().terminate_all()

    def join_all(self) -> None:
        super().join_all()
        for process in self.processes:
            self.forget(process.pid)
