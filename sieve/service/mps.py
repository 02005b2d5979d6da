"""CUDA MPS (NVIDIA's Multi-Process Service) for the workers of `sieve serve` on one GPU (Settings.cuda_mps).

Each worker opens its own CUDA context; without MPS the GPU time-slices those contexts and the kernels of different
workers never overlap. Through an MPS control daemon they share the GPU as one client: 8 workers on one H200 answered
the default /search at 1,732 instead of 1,232 per second at 64 clients (SciFact x 9, the daemon started by hand:
benchmarks/results/gpu_nvidia_h200_s38_mps.json and _workers.json; docs/deployment.md).

The supervisor (service/supervisor.py) calls share_gpu before it spawns the workers: it uses a daemon that is
already running, else starts one under a private pipe directory that the workers inherit through
CUDA_MPS_PIPE_DIRECTORY, and stops it when it exits. It only runs NVIDIA's control binary: the supervisor still
never imports torch nor touches CUDA. What was decided reaches each worker's /readyz (`workers.mps`) through
STATE_ENV, as workers.CHOSEN_ENV carries how the worker count was chosen.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"  # NVIDIA's control binary: `-d` starts the daemon, `quit` on stdin stops it
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"  # where CUDA clients (the workers) look for the daemon's `control` socket
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE = Path("/tmp/nvidia-mps")  # CUDA's pipe directory when PIPE_ENV is unset
STATE_ENV = "SIEVE_CUDA_MPS_STATE"  # the supervisor tells its workers what it decided (/readyz), as JSON
START_WAIT_S = 5.0  # how long the daemon's control socket may take to appear
STOP_WAIT_S = 5.0
MEASURED = ("with MPS, 8 workers on one H200 answered 1,732 instead of 1,232 /search per second at 64 clients "
            "(SciFact x 9, 46,647 documents)")

log = logging.getLogger("sieve.workers")


class DaemonError(RuntimeError):
    """The control daemon could not be started (the message says why, with its log's last lines)."""


@dataclass(frozen=True)
class Daemon:
    """A control daemon this supervisor started, under its own pipe and log directories."""
    binary: str
    pipe: Path
    logs: Path

    def env(self, base: MutableMapping[str, str]) -> dict[str, str]:
        return {**base, PIPE_ENV: str(self.pipe), LOG_ENV: str(self.logs)}

    @property
    def control(self) -> Path:
        return self.pipe / "control"

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the daemon's logs (control.log, server.log), for a start that failed."""
        text = [line for path in sorted(self.logs.glob("*.log"))
                for line in path.read_text(errors="replace").splitlines()]
        return " | ".join(text[-lines:]) or "(empty)"

    def stop(self, base: MutableMapping[str, str]) -> None:
        """`quit` to the daemon (it stops its MPS server too), then its directories go."""
        try:
            subprocess.run([self.binary], input="quit\n", text=True, env=self.env(base), capture_output=True,
                           timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("the CUDA MPS control daemon at %s did not take `quit`: %s", self.pipe, exc)
        appears(self.control, STOP_WAIT_S, gone=True)
        shutil.rmtree(self.pipe, ignore_errors=True)
        shutil.rmtree(self.logs, ignore_errors=True)


@dataclass(frozen=True)
class Sharing:
    """How the workers share the GPU: `state` is started, running, unavailable, off, not cuda or one worker."""
    state: str
    reason: str
    pipe_directory: str | None = None
    daemon: Daemon | None = None  # the daemon this supervisor started (stopped at its exit)

    def report(self) -> dict:
        """/readyz `workers.mps`."""
        return {"state": self.state, "pipe_directory": self.pipe_directory, "reason": self.reason}

    def stop(self, base: MutableMapping[str, str] = os.environ) -> None:
        if self.daemon is not None:
            self.daemon.stop(base)


def needed(mode: str, kind: str, count: int) -> Sharing | None:
    """None: the workers want MPS (SIEVE_CUDA_MPS auto or on, CUDA, several workers); else why not. `on` insists
    only where MPS applies: on a CPU or with one worker there is nothing to share."""
    if mode == "off":
        return Sharing("off", "SIEVE_CUDA_MPS=off: the workers time-slice the GPU")
    if kind != "cuda":
        return Sharing("not cuda", f"the workers run on the {kind}: nothing to share")
    if count <= 1:
        return Sharing("one worker", "one worker process: MPS only pays with several on one GPU")
    return None


def running(environ: MutableMapping[str, str], default_pipe: Path | None = None) -> Sharing | None:
    """A daemon the workers reach already: the control socket in CUDA_MPS_PIPE_DIRECTORY when that is set (the
    workers look there only), else in CUDA's default directory. Only the socket's presence is checked: one left by a
    daemon that died reads as running, and the workers' CUDA then runs without MPS."""
    given = environ.get(PIPE_ENV)
    pipe = Path(given) if given else (default_pipe or DEFAULT_PIPE)
    if (pipe / "control").exists():
        return Sharing("running", "an MPS control daemon was already running (not started by sieve)", str(pipe))
    return None


def appears(path: Path, wait_s: float, gone: bool = False) -> bool:
    """Whether `path` exists (gone: no longer exists) within `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while path.exists() == gone:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def start_daemon(binary: str, environ: MutableMapping[str, str], wait_s: float = START_WAIT_S) -> Daemon:
    """`nvidia-cuda-mps-control -d` under new private pipe and log directories; returns once its control socket is
    there. DaemonError (the daemon stopped and its directories removed) when it is not within `wait_s`."""
    daemon = Daemon(binary, Path(tempfile.mkdtemp(prefix="sieve-mps-pipe-")),
                    Path(tempfile.mkdtemp(prefix="sieve-mps-log-")))
    try:
        done = subprocess.run([binary, "-d"], env=daemon.env(environ), capture_output=True, text=True, timeout=30)
        problem = None if done.returncode == 0 else f"`{binary} -d` exited {done.returncode}: {done.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as exc:
        problem = f"`{binary} -d` failed: {exc}"
    if problem is None and appears(daemon.control, wait_s):
        return daemon
    problem = problem or f"no control socket in {daemon.pipe} within {wait_s:g} s"
    tail = daemon.log_tail()
    daemon.stop(environ)
    raise DaemonError(f"the CUDA MPS control daemon did not come up ({problem}); its log: {tail}")


def without_mps(mode: str, count: int, why: str) -> Sharing:
    """No MPS to be had: `on` refuses to start (one line, as the CLI's other refusals), `auto` warns and goes on."""
    if mode == "on":
        raise SystemExit(f"sieve: SIEVE_CUDA_MPS=on but {why}; install NVIDIA's MPS binaries ({CONTROL}) or start "
                         f"the MPS control daemon before `sieve serve`, or set SIEVE_CUDA_MPS=auto or off")
    log.warning("%d workers will time-slice the GPU, their kernels never overlapping: no CUDA MPS (%s). Install "
                "NVIDIA's MPS binaries (%s) or run the MPS control daemon before `sieve serve` (docs/deployment.md): "
                "%s. SIEVE_CUDA_MPS=off silences this.", count, why, CONTROL, MEASURED)
    return Sharing("unavailable", why)


def share_gpu(mode: str, kind: str, count: int, environ: MutableMapping[str, str] = os.environ,
              default_pipe: Path | None = None, wait_s: float = START_WAIT_S) -> Sharing:
    """Decide, and start a daemon where needed: CUDA_MPS_* and STATE_ENV are set in `environ`, which the workers
    spawned next inherit. The caller stops a daemon started here (Sharing.stop) when the workers are gone."""
    sharing = needed(mode, kind, count) or running(environ, default_pipe) or start(mode, count, environ, wait_s)
    environ[STATE_ENV] = json.dumps(sharing.report())
    if sharing.state in ("started", "running"):
        log.info("CUDA MPS: %s (%s)", sharing.reason, sharing.pipe_directory)
    return sharing


def start(mode: str, count: int, environ: MutableMapping[str, str], wait_s: float) -> Sharing:
    binary = shutil.which(CONTROL, path=environ.get("PATH"))
    if binary is None:
        return without_mps(mode, count, f"{CONTROL} is not on PATH")
    try:
        daemon = start_daemon(binary, environ, wait_s)
    except DaemonError as exc:
        return without_mps(mode, count, str(exc))
    environ[PIPE_ENV], environ[LOG_ENV] = str(daemon.pipe), str(daemon.logs)
    return Sharing("started", f"sieve started the MPS control daemon ({binary})", str(daemon.pipe), daemon)


def reported() -> dict | None:
    """/readyz `workers.mps` in a worker: what its supervisor decided; None in a single process (no decision)."""
    found = os.environ.get(STATE_ENV)
    return json.loads(found) if found else None
