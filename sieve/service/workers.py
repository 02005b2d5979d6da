"""Worker processes: `sieve serve --workers N` (SIEVE_WORKERS) runs N processes answering on one port, all serving
one index directory. This module: how many, and what a worker tells /readyz; service/supervisor.py starts them,
service/app.py's worker_app is what each one runs.

- Start-up: the process started (the supervisor) binds the port and starts the workers with uvicorn's multiprocess
  supervisor, which SPAWNS them (fresh interpreters: nothing is forked from a process that has torch threads or a
  CUDA context). Each worker loads its own models and index in its app's lifespan, then listens: on Linux on a
  socket of its own bound to the port with SO_REUSEPORT, the kernel spreading new connections over the workers by
  address (Settings.reuse_port; elsewhere one shared socket, whose connections go to whichever worker accepts first).
- Writes: each worker has its own index writer thread; the writer lock and the atomic CURRENT switch of the index
  directory order them, as between replicas (docs/index.md). Before a request reads the index, a worker compares
  CURRENT with what it has loaded (one stat) and swaps in a version another worker published (IndexUpdater.catch_up),
  so a write acknowledged by one worker is read by the next request on any other.
- Metrics: prometheus-client's multiprocess mode in a directory this supervisor makes (or PROMETHEUS_MULTIPROC_DIR
  when given, emptied at start); /metrics from any worker adds up every worker (service/metrics.py).
- Readiness: each worker leaves a marker beside the metrics while it listens (its models loaded); /readyz answers
  200 only while every worker is ready (service/routes.py), a worker that died (even one not yet reaped) is not.
- A worker that dies is replaced (uvicorn's supervisor restarts it); its live gauges and marker are removed here.
  What it had acknowledged is on disk already: a write is acknowledged only after its version is published.
- SIGTERM (or SIGINT) to the supervisor: it closes its copy of the socket and sends SIGTERM to every worker, each of
  which stops listening and answers what it has in flight (within the grace period) before it exits. SIGHUP replaces
  the workers one by one (each new one serving before the old one stops), SIGTTIN / SIGTTOU add or remove one.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sieve.service import mps
from sieve.service.config import Settings
from sieve.service.pinning import interpreter_status

METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
CHOSEN_ENV = "SIEVE_WORKERS_CHOSEN"  # the supervisor tells its workers how their number was chosen (/readyz)
READY_SUFFIX = ".ready"


@dataclass(frozen=True)
class Plan:
    count: int
    chosen: str  # how: the setting, or the automatic rule with its inputs


def usable_cores() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 CPU quota (a container's CPU limit)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cores


@functools.cache  # the supervisor asks twice (the worker count, CUDA MPS): one probe
def device_kind(device: str) -> str:
    """cuda or cpu, for the automatic worker count and CUDA MPS; `auto` asks torch in a child process (when a GPU
    driver is there at all), so the supervisor never imports torch or touches CUDA."""
    if device.startswith("cuda"):
        return "cuda"
    if device == "cpu" or not Path("/dev/nvidiactl").exists():
        return "cpu"
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300)
    return "cuda" if probe.stdout.strip() == "True" else "cpu"


def plan(settings: Settings, cores: int | None = None, kind: str | None = None) -> Plan:
    """SIEVE_WORKERS when set; else on CUDA one worker per 2 CPU cores (at most 8: the per-request Python work is
    the limit and the GPU has room for all of them), on a CPU one per 4 cores but at least 2 from 2 cores (at most 4:
    there the models use the cores, and each worker loads its own copy of them). Two workers on 2 cores, each on its
    own CPU and listening socket, answered 1.67x one worker's default /search with the real models (Zen 4, RESULTS.md
    issue 32, tenth session; Intel Xeon 1.26-1.52x)."""
    if settings.workers:
        return Plan(settings.workers, "SIEVE_WORKERS")
    if in_process_backend(settings):
        return Plan(1, f"auto: SIEVE_INDEX_BACKEND={settings.index_backend} in this process (one process per folder)")
    cores = cores or usable_cores()
    kind = kind or device_kind(settings.device)
    if kind == "cuda":
        return Plan(max(1, min(8, cores // 2)), f"auto: {cores} CPU cores, cuda: one worker per 2 cores, at most 8")
    return Plan(min(4, max(min(cores, 2), cores // 4)),
                f"auto: {cores} CPU cores, cpu: one worker per 4 cores, at least 2 from 2 cores, at most 4")


def in_process_backend(settings: Settings) -> bool:
    """An index backend that lives in this process (Qdrant's local mode, a Qdrant Edge shard): one process only."""
    return settings.index_backend == "qdrant-edge" or (settings.index_backend == "qdrant"
                                                        and not settings.qdrant_url.startswith("http"))


def check_backend(settings: Settings, count: int) -> None:
    """Workers share a local index directory or a Qdrant server; an in-process Qdrant belongs to one process."""
    if count > 1 and in_process_backend(settings):
        raise SystemExit(f"sieve: {count} workers cannot share SIEVE_INDEX_BACKEND={settings.index_backend} at "
                         f"{settings.qdrant_url if settings.index_backend == 'qdrant' else settings.qdrant_edge_path}"
                         " (one process per Qdrant directory); use a Qdrant server (http://...) or SIEVE_WORKERS=1")


# -- the workers' side ----------------------------------------------------------------------------------------------
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
    """Whether the process runs: one that exited and is not yet reaped by its parent (a zombie) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not zombie(pid)


def zombie(pid: int) -> bool:
    """An exited process its parent has not yet waited for: it still answers kill(pid, 0) (False without /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


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
            "torch_threads": torch.get_num_threads(),
            "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "interpreter": interpreter_status(), "blas_threads": blas_threads(), "mps": mps.reported()}


def blas_threads() -> int | None:
    """Threads numpy's BLAS may use in this process (its wheel's OpenBLAS; any BLAS when numpy's is not told apart)."""
    from threadpoolctl import threadpool_info

    found = [i for i in threadpool_info() if i["user_api"] == "blas"]
    numpy_own = [i for i in found if "numpy" in i["filepath"]] or found
    return max(i["num_threads"] for i in numpy_own) if numpy_own else None
