"""Worker processes: `sieve serve --workers N` (SIEVE_WORKERS) runs N processes answering on one port, all serving
one index directory.

- Start-up: this process (the supervisor) binds the port and starts the workers with uvicorn's multiprocess
  supervisor, which SPAWNS them (fresh interpreters: nothing is forked from a process that has torch threads or a
  CUDA context). Each worker loads its own models and index in its app's lifespan, then accepts connections from the
  shared socket; the kernel hands each new connection to one worker.
- Writes: each worker has its own index writer thread; the writer lock and the atomic CURRENT switch of the index
  directory order them, as between replicas (docs/index.md). Before a request reads the index, a worker compares
  CURRENT with what it has loaded (one stat) and swaps in a version another worker published (IndexUpdater.catch_up),
  so a write acknowledged by one worker is read by the next request on any other.
- Metrics: prometheus-client's multiprocess mode in a directory this supervisor makes (or PROMETHEUS_MULTIPROC_DIR
  when given, emptied at start); /metrics from any worker adds up every worker (service/metrics.py).
- Readiness: each worker leaves a marker beside the metrics once its models are loaded; /readyz answers 200 only
  while every worker is ready (service/routes.py).
- A worker that dies is replaced (uvicorn's supervisor restarts it); its live gauges and marker are removed here.
  What it had acknowledged is on disk already: a write is acknowledged only after its version is published.
- SIGTERM (or SIGINT) to the supervisor: it closes its copy of the socket and sends SIGTERM to every worker, each of
  which answers what it has in flight (within the grace period) before it exits.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sieve.service.config import Settings

log = logging.getLogger("sieve.workers")
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
CHOSEN_ENV = "SIEVE_WORKERS_CHOSEN"  # the supervisor tells its workers how their number was chosen (/readyz)
READY_SUFFIX = ".ready"
HEALTHCHECK_S = 30.0  # a worker busy with its GIL-bound work may be slow to answer the supervisor's ping
# fields `sieve serve` takes from its command line too: handed to the workers through their environment
CLI_FIELDS = ("index_dir", "host", "port", "index_backend", "qdrant_url", "qdrant_collection", "qdrant_edge_path",
              "workers")


@dataclass(frozen=True)
class Plan:
    count: int
    chosen: str  # how: the setting, or the automatic rule with its inputs


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def device_kind(device: str) -> str:
    """cuda or cpu, for the automatic worker count; `auto` asks torch in a child process (when a GPU driver is
    there at all), so the supervisor never imports torch or touches CUDA."""
    if device.startswith("cuda"):
        return "cuda"
    if device == "cpu" or not Path("/dev/nvidiactl").exists():
        return "cpu"
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300)
    return "cuda" if probe.stdout.strip() == "True" else "cpu"


def plan(settings: Settings, cores: int | None = None, kind: str | None = None) -> Plan:
    """SIEVE_WORKERS when set; else on CUDA one worker per 2 CPU cores (at most 8: the per-request Python work is
    the limit and the GPU has room for all of them), on a CPU one per 4 cores (at most 4: there the models use the
    cores, and each worker loads its own copy of them)."""
    if settings.workers:
        return Plan(settings.workers, "SIEVE_WORKERS")
    cores = cores or usable_cores()
    kind = kind or device_kind(settings.device)
    if kind == "cuda":
        return Plan(max(1, min(8, cores // 2)), f"auto: {cores} CPU cores, cuda: one worker per 2 cores, at most 8")
    return Plan(max(1, min(4, cores // 4)), f"auto: {cores} CPU cores, cpu: one worker per 4 cores, at most 4")


def check_backend(settings: Settings, count: int) -> None:
    """Workers share a local index directory or a Qdrant server; an in-process Qdrant belongs to one process."""
    if count > 1 and (settings.index_backend == "qdrant-edge"
                      or (settings.index_backend == "qdrant" and not settings.qdrant_url.startswith("http"))):
        raise SystemExit(f"sieve: {count} workers cannot share SIEVE_INDEX_BACKEND={settings.index_backend} at "
                         f"{settings.qdrant_url if settings.index_backend == 'qdrant' else settings.qdrant_edge_path}"
                         " (one process per Qdrant directory); use a Qdrant server (http://...) or SIEVE_WORKERS=1")


# -- the workers' side ----------------------------------------------------------------------------------------------
def worker_app():
    """The app of one worker (a uvicorn factory): settings from the environment the supervisor set up."""
    from sieve.service.app import create_app
    from sieve.service.connections import BoundedH11Protocol

    settings = Settings()
    BoundedH11Protocol.header_timeout_s = settings.header_timeout_s  # the class uvicorn was handed by name
    return create_app(settings)


def metrics_dir() -> Path | None:
    """Where the workers of this server keep their metrics and readiness markers (None: a single process)."""
    path = os.environ.get(METRICS_ENV)
    return Path(path) if path else None


def mark_ready(ready: bool) -> None:
    """This worker's marker: present while it serves."""
    folder = metrics_dir()
    if folder is None:
        return
    marker = folder / f"worker-{os.getpid()}{READY_SUFFIX}"
    if ready:
        marker.touch()
    else:
        marker.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ready_count() -> int:
    """Workers of this server that have loaded their models and are serving (1 for a single process)."""
    folder = metrics_dir()
    if folder is None:
        return 1
    pids = [int(p.name[len("worker-"):-len(READY_SUFFIX)]) for p in folder.glob(f"worker-*{READY_SUFFIX}")]
    return sum(alive(pid) for pid in pids)


def status(settings: Settings) -> dict:
    """/readyz `workers`."""
    import torch

    count = settings.workers or 1
    return {"count": count, "ready": ready_count() if count > 1 else 1, "pid": os.getpid(),
            "chosen": os.environ.get(CHOSEN_ENV, "SIEVE_WORKERS" if settings.workers else "one process"),
            "torch_threads": torch.get_num_threads()}


# -- the supervisor's side -----------------------------------------------------------------------------------------
def prepare_metrics_dir() -> tuple[Path, bool]:
    """The multiprocess metrics directory, emptied: PROMETHEUS_MULTIPROC_DIR when set, else a new one (removed at
    exit). Returns (path, made here)."""
    given = os.environ.get(METRICS_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in [*path.glob("*.db"), *path.glob(f"*{READY_SUFFIX}")]:
            stale.unlink(missing_ok=True)
        return path, False
    return Path(tempfile.mkdtemp(prefix="sieve-workers-")), True


def worker_environment(settings: Settings, chosen: Plan, folder: Path) -> None:
    """What the spawned workers inherit: the command-line settings, the metrics directory, torch threads."""
    for name in CLI_FIELDS:
        value = getattr(settings, name)
        if value is not None:
            os.environ[f"SIEVE_{name.upper()}"] = str(value)
    os.environ["SIEVE_WORKERS"] = str(chosen.count)
    os.environ[CHOSEN_ENV] = chosen.chosen
    os.environ[METRICS_ENV] = str(folder)
    if settings.torch_threads is None:  # N workers x all cores each would oversubscribe the CPU
        os.environ["SIEVE_TORCH_THREADS"] = str(max(1, usable_cores() // chosen.count))


def serve(settings: Settings, chosen: Plan | None = None, factory: str = f"{__name__}:worker_app") -> None:
    """Run `chosen.count` workers on settings.host:port until SIGTERM/SIGINT. `factory`: the import string of the
    app factory each worker calls (benchmarks/zero_cost.py hands its own)."""
    import uvicorn

    from sieve.service.supervisor import Supervisor

    chosen = chosen or plan(settings)
    check_backend(settings, chosen.count)
    folder, made = prepare_metrics_dir()
    worker_environment(settings, chosen, folder)
    grace_s = (settings.default_timeout_ms or 30_000) / 1000 + 5
    config = uvicorn.Config(factory, factory=True, host=settings.host, port=settings.port, workers=chosen.count,
                            log_level=settings.log_level, http="sieve.service.connections:BoundedH11Protocol",
                            h11_max_incomplete_event_size=settings.max_header_bytes,
                            timeout_graceful_shutdown=grace_s, timeout_worker_healthcheck=HEALTHCHECK_S)
    log.info("starting %d workers (%s) on %s:%d", chosen.count, chosen.chosen, settings.host, settings.port)
    try:
        Supervisor(config, sockets=[config.bind_socket()], metrics_dir=folder).run()
    finally:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
