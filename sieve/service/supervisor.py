"""Starts and watches the worker processes of `sieve serve` (service/workers.py says how many): uvicorn's
multiprocess supervisor, plus what Sieve's workers need around it. A worker that dies leaves no live gauges or
readiness marker behind (prometheus-client's mark_process_dead); on shutdown the supervisor lets go of the listening
socket first, so new connections are refused while the workers drain."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from uvicorn.supervisors.multiprocess import Multiprocess

from sieve.service import connections, workers
from sieve.service.config import Settings

HEALTHCHECK_S = 30.0  # a worker busy with its GIL-bound work may be slow to answer the supervisor's ping
# fields `sieve serve` takes from its command line too: handed to the workers through their environment
CLI_FIELDS = ("index_dir", "host", "port", "index_backend", "qdrant_url", "qdrant_collection", "qdrant_edge_path",
              "workers")

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
        (self.metrics_dir / f"worker-{pid}{workers.READY_SUFFIX}").unlink(missing_ok=True)

    def terminate_all(self) -> None:
        for sock in self.sockets:  # the workers hold their own copies until each has stopped accepting
            sock.close()
        super().terminate_all()

    def join_all(self) -> None:
        super().join_all()
        for process in self.processes:
            self.forget(process.pid)


def prepare_metrics_dir() -> tuple[Path, bool]:
    """The multiprocess metrics directory, emptied: PROMETHEUS_MULTIPROC_DIR when set, else a new one (removed at
    exit). Returns (path, made here)."""
    given = os.environ.get(workers.METRICS_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in [*path.glob("*.db"), *path.glob(f"*{workers.READY_SUFFIX}")]:
            stale.unlink(missing_ok=True)
        return path, False
    return Path(tempfile.mkdtemp(prefix="sieve-workers-")), True


def worker_environment(settings: Settings, chosen: workers.Plan, folder: Path) -> None:
    """What the spawned workers inherit: the command-line settings, the metrics directory, torch threads."""
    for name in CLI_FIELDS:
        value = getattr(settings, name)
        if value is not None:
            os.environ[f"SIEVE_{name.upper()}"] = str(value)
    os.environ["SIEVE_WORKERS"] = str(chosen.count)
    os.environ[workers.CHOSEN_ENV] = chosen.chosen
    os.environ[workers.METRICS_ENV] = str(folder)
    if settings.torch_threads is None:  # N workers x all cores each would oversubscribe the CPU
        os.environ["SIEVE_TORCH_THREADS"] = str(max(1, workers.usable_cores() // chosen.count))


def serve(settings: Settings, chosen: workers.Plan | None = None,
          factory: str = "sieve.service.app:worker_app") -> None:
    """Run `chosen.count` workers on settings.host:port until SIGTERM/SIGINT. `factory`: the import string of the
    app factory each worker calls (benchmarks/zero_cost.py hands its own)."""
    import uvicorn

    chosen = chosen or workers.plan(settings)
    workers.check_backend(settings, chosen.count)
    folder, made = prepare_metrics_dir()
    worker_environment(settings, chosen, folder)
    grace_s = (settings.default_timeout_ms or 30_000) / 1000 + 5
    config = uvicorn.Config(factory, factory=True, host=settings.host, port=settings.port, workers=chosen.count,
                            log_level=settings.log_level, http=f"sieve.service.connections:{connections.protocol_name(settings.http_parser)}",
                            h11_max_incomplete_event_size=settings.max_header_bytes,
                            timeout_graceful_shutdown=grace_s, timeout_worker_healthcheck=HEALTHCHECK_S)
    log.info("starting %d workers (%s) on %s:%d", chosen.count, chosen.chosen, settings.host, settings.port)
    try:
        Supervisor(config, sockets=[config.bind_socket()], metrics_dir=folder).run()
    finally:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
