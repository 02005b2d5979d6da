"""Starts and watches the worker processes of `sieve serve` (service/workers.py says how many): uvicorn's
multiprocess supervisor, plus what Sieve's workers need around it. A worker that dies leaves no live gauges or
readiness marker behind (prometheus-client's mark_process_dead); on shutdown the supervisor lets go of the listening
sockets first, so new connections are refused while the workers drain.

Listening (Settings.reuse_port): on Linux each worker gets a socket of its own, bound to the port with SO_REUSEPORT,
and the kernel spreads new connections over the workers by their addresses. With one shared socket the worker whose
event loop wakes first takes every connection then queued (asyncio accepts them all at once), so a client's burst of
keep-alive connections could all land on one worker and stay there (RESULTS.md, issue 32). A worker's socket listens
from the end of its start-up (uvicorn calls listen() after the app's lifespan has loaded the models), so no
connection waits in the queue of a worker still loading, and it lives only as long as its worker (the supervisor keeps
no copy): a worker that stops accepting or dies takes its socket with it, the kernel sends new connections to the
others, and resets those queued there and never read (none was answered or acknowledged; with the host's
net.ipv4.tcp_migrate_req = 1 the kernel moves them to another worker's socket instead)."""
from __future__ import annotations

import logging
import os
import pickle
import shutil
import socket
import sys
import tempfile
from multiprocessing.connection import wait
from pathlib import Path

import uvicorn
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from sieve.service import access_log, connections, mps, workers
from sieve.service.config import Settings

HEALTHCHECK_S = 30.0  # a worker busy with its GIL-bound work may be slow to answer the supervisor's ping
# a new worker is ready once its models and index are loaded: seconds on a quiet machine, but a SIGHUP restart that
# waited only HEALTHCHECK_S gave up (old workers kept) while a test suite loaded a 2-core Zen 3 host; one that dies
# while loading ends the wait at once, so only a hung start waits this long
START_READY_S = 600.0
# fields `sieve serve` takes from its command line too: handed to the workers through their environment
CLI_FIELDS = ("index_dir", "host", "port", "index_backend", "qdrant_url", "qdrant_collection", "qdrant_edge_path",
              "workers")

log = logging.getLogger("sieve.workers")


def reuse_port_available() -> bool:
    """SO_REUSEPORT spreads connections over the sockets only on Linux (elsewhere the last socket bound gets them)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT, not yet listening: the worker it is handed to listens."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def migrate_req() -> int | None:
    """The host's net.ipv4.tcp_migrate_req (None: not readable, a kernel before 5.14)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_migrate_req").read_text())
    except (OSError, ValueError):
        return None


class WorkerServer(uvicorn.Server):
    """A worker's server: its readiness marker (/readyz) is there from the moment it listens until it stops
    listening, not from the end of its app's start-up, a moment before it listens."""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            workers.mark_ready(True)

    async def shutdown(self, sockets=None) -> None:
        workers.mark_ready(False)
        await super().shutdown(sockets)


class WorkerProcess(Process):
    """uvicorn's worker process, running a WorkerServer."""

    def target(self, sockets=None) -> None:  # runs in the worker
        thread_lock_for_progress_bars()
        super().target(sockets)

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = WorkerServer(config=self.config)
        return self._server


def thread_lock_for_progress_bars() -> None:
    """tqdm's default lock holds a multiprocessing lock, a named semaphore that a spawned worker registers with the
    supervisor's resource tracker and unlinks at a normal exit. uvicorn ends a worker that was sent SIGTERM by raising
    the signal again once it has drained, which skips that exit, so every worker left its semaphore to the tracker,
    and `sieve serve` ended with "resource_tracker: There appear to be N leaked semaphore objects". A worker's progress
    bars (start-up only) need a thread lock, nothing across processes."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def answers(process: Process, timeout: float) -> bool:
    """Whether the worker is alive and answers the supervisor's ping within `timeout`. uvicorn's own check waits the
    whole timeout for a worker that dies once pinged (the supervisor holds the pipe's other end too, so no EOF
    comes): this one also wakes when the process exits, so a dead worker is replaced at once."""
    if not process.process.is_alive():
        return False
    try:
        process.parent_conn.send(b"ping")
        if process.parent_conn not in wait([process.parent_conn, process.process.sentinel], timeout):
            return False  # it exited, or it is hung
        process.parent_conn.recv()
        return True
    except (OSError, EOFError, pickle.UnpicklingError):
        return False


class Supervisor(Multiprocess):
    """`per_worker`: each worker listens on a socket of its own (SO_REUSEPORT), made here for it; else every worker
    shares `sockets`."""

    def __init__(self, config, sockets, metrics_dir: Path, per_worker: bool = False):
        super().__init__(config, sockets)
        self.metrics_dir = metrics_dir
        self.per_worker = per_worker

    def new_process(self) -> Process:
        """A started worker; with per_worker, on a new socket bound to the port the first one got."""
        if not self.per_worker:
            process = WorkerProcess(self.config, self.sockets)
            process.start()
            return process
        sock = reuse_port_socket(self.config.host, self.port)
        try:
            process = WorkerProcess(self.config, [sock])
            process.start()  # spawn: the socket is handed over (multiprocessing keeps a copy until the worker has it)
        finally:
            sock.close()  # so the socket lives as long as its worker: when the worker closes it or dies, the kernel
        return process    # stops queueing connections there at once (and resets those queued, never read)

    @property
    def port(self) -> int:
        return self.sockets[0].getsockname()[1] if self.sockets else self.config.port

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            self.processes.append(self.new_process())

    def keep_subprocess_alive(self) -> None:
        """uvicorn's loop, and what Sieve adds: a dead or hung worker is killed, its gauges and readiness marker go,
        and a new worker takes its place."""
        from uvicorn.config import STARTUP_FAILURE

        if self.should_exit.is_set():
            return
        for idx, process in enumerate(self.processes):
            if answers(process, self.config.timeout_worker_healthcheck):
                continue
            process.kill()
            process.join()
            self.forget(process.pid)
            if process.exitcode == STARTUP_FAILURE:  # the app or the index is broken: every restart would fail
                log.error("worker %s failed to start; stopping", process.pid)
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            log.warning("worker %s exited (code %s); a new worker is starting", process.pid, process.exitcode)
            self.processes[idx] = self.new_process()

    def restart_all(self) -> None:
        """SIGHUP: uvicorn's rolling restart (each new worker serving before the old one is told to stop)."""
        for idx, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self.new_process()
            if not new.wait_until_ready(START_READY_S, self.should_exit):
                new.kill()
                new.join()
                self.forget(new.pid)
                log.error("worker %s was not ready in time; worker %s kept, the restart stopped", new.pid, old.pid)
                return
            old.terminate()
            old.join()
            self.forget(old.pid)
            self.processes[idx] = new

    def handle_ttin(self) -> None:  # SIGTTIN: one worker more, as uvicorn's (per_worker: on a socket of its own)
        self.processes_num += 1
        self.processes.append(self.new_process())

    def handle_ttou(self) -> None:  # SIGTTOU: one worker fewer, as uvicorn's; its marker and socket go once it exited
        if self.processes_num <= 1:
            return super().handle_ttou()
        self.processes_num -= 1
        process = self.processes.pop()
        process.terminate()
        process.join()
        self.forget(process.pid)

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
    """Run `chosen.count` workers on settings.host:port until SIGTERM/SIGINT; several on CUDA share the GPU through
    CUDA MPS where it can be had (service/mps.py, SIEVE_CUDA_MPS). `factory`: the import string of the app factory
    each worker calls (benchmarks/zero_cost.py hands its own)."""
    import uvicorn

    chosen = chosen or workers.plan(settings)
    workers.check_backend(settings, chosen.count)
    folder, made = prepare_metrics_dir()
    worker_environment(settings, chosen, folder)
    grace_s = (settings.default_timeout_ms or 30_000) / 1000 + 5
    config = uvicorn.Config(factory, factory=True, host=settings.host, port=settings.port, workers=chosen.count,
                            **access_log.uvicorn_options(settings), http=f"sieve.service.connections:{connections.protocol_name(settings.http_parser)}",
                            h11_max_incomplete_event_size=settings.max_header_bytes,
                            timeout_graceful_shutdown=grace_s, timeout_worker_healthcheck=HEALTHCHECK_S)
    log.info("starting %d workers (%s) on %s:%d", chosen.count, chosen.chosen, settings.host, settings.port)
    per_worker = settings.reuse_port is not False and reuse_port_available()
    first = reuse_port_socket(settings.host, settings.port) if per_worker else config.bind_socket()
    if per_worker and migrate_req() == 0:
        log.info("each worker listens on its own socket; one that stops resets the connections queued on it and "
                 "not yet read (set net.ipv4.tcp_migrate_req=1 to have the kernel hand them to another worker)")
    sharing = None
    try:  # per_worker: `first` only holds the port (bound, never listening, so no connection is queued on it)
        supervisor = Supervisor(config, sockets=[first], metrics_dir=folder, per_worker=per_worker)
        # its signal handlers are set: SIGTERM or SIGINT from here ends run() and an MPS daemon started now is
        # stopped below; the workers it spawns inherit the CUDA_MPS_* environment share_gpu sets
        sharing = mps.share_gpu(settings.cuda_mps, workers.device_kind(settings.device), chosen.count)
        supervisor.run()
    finally:
        if sharing is not None:
            sharing.stop()
        if made:
            shutil.rmtree(folder, ignore_errors=True)
