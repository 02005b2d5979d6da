"""CUDA MPS for the workers of `sieve serve` (service/mps.py, SIEVE_CUDA_MPS), without a GPU: NVIDIA's control
binary is replaced by a stand-in `nvidia-cuda-mps-control` first on PATH, which records its arguments, its
CUDA_MPS_* environment and its stdin, and on `-d` makes the `control` socket file in CUDA_MPS_PIPE_DIRECTORY (or,
broken, only writes a line to its log). What a real daemon does with the workers' CUDA contexts is not tested here."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sieve.service import mps, supervisor, workers
from sieve.service.config import Settings
from tests.server import REPO, free_port

STAND_IN = """#!{python}
import json, os, sys
from pathlib import Path

daemon = sys.argv[1:] == ["-d"]
stdin = "" if daemon else sys.stdin.read()
with open({record!r}, "a") as out:
    out.write(json.dumps({{"args": sys.argv[1:], "stdin": stdin, "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                          "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
if daemon and {broken!r}:
    Path(os.environ["CUDA_MPS_LOG_DIRECTORY"], "control.log").write_text("[mps] cannot open /dev/nvidiactl\\n")
elif daemon:
    (pipe / "control").write_text("")
elif stdin.strip() == "quit":
    (pipe / "control").unlink(missing_ok=True)
"""


def stand_in(folder: Path, broken: bool = False) -> Path:
    """A folder holding an executable `nvidia-cuda-mps-control`; its calls go to folder/calls.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / mps.CONTROL
    binary.write_text(STAND_IN.format(python=sys.executable, record=str(folder / "calls.jsonl"), broken=broken))
    binary.chmod(0o755)
    return folder


def calls(folder: Path) -> list[dict]:
    record = folder / "calls.jsonl"
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


@pytest.fixture()
def private_tmp(tmp_path, monkeypatch) -> Path:
    """tempfile's directories (the daemon's pipe and log directories, the metrics directory) made under one folder
    of the test's own, so a test can see that none is left behind."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("mode, kind, count, state", [
    ("auto", "cuda", 8, None), ("on", "cuda", 2, None), ("off", "cuda", 8, "off"), ("auto", "cpu", 4, "not cuda"),
    ("on", "cpu", 4, "not cuda"), ("auto", "cuda", 1, "one worker"), ("on", "cuda", 1, "one worker")])
def test_mps_is_wanted_only_for_several_workers_on_cuda_unless_off(mode, kind, count, state):
    decided = mps.needed(mode, kind, count)
    assert (decided and decided.state) == state


def test_a_started_daemon_is_exported_to_the_workers_and_quit_at_stop(tmp_path, private_tmp):
    tools = stand_in(tmp_path / "bin")
    environ = {"PATH": str(tools)}
    sharing = mps.share_gpu("auto", "cuda", 8, environ, default_pipe=tmp_path / "no-daemon")
    assert sharing.state == "started" and sharing.pipe_directory == environ[mps.PIPE_ENV]
    pipe, logs = Path(environ[mps.PIPE_ENV]), Path(environ[mps.LOG_ENV])
    assert pipe.parent == logs.parent == private_tmp and (pipe / "control").exists() and logs.is_dir()
    assert calls(tools) == [{"args": ["-d"], "stdin": "", "pipe": str(pipe), "log": str(logs)}]
    assert json.loads(environ[mps.STATE_ENV]) == sharing.report()
    sharing.stop(environ)
    assert calls(tools)[1:] == [{"args": [], "stdin": "quit\n", "pipe": str(pipe), "log": str(logs)}]
    assert list(private_tmp.iterdir()) == []  # both directories removed


@pytest.mark.parametrize("given", [True, False])
def test_a_daemon_already_running_is_used_and_nothing_is_started(given, tmp_path, private_tmp):
    """CUDA_MPS_PIPE_DIRECTORY's control socket when that is set, else the one in CUDA's default directory."""
    tools, pipe = stand_in(tmp_path / "bin"), tmp_path / "theirs"
    pipe.mkdir()
    (pipe / "control").write_text("")
    environ = {"PATH": str(tools), **({mps.PIPE_ENV: str(pipe)} if given else {})}
    sharing = mps.share_gpu("on", "cuda", 8, environ, default_pipe=pipe if not given else tmp_path / "default")
    assert (sharing.state, sharing.pipe_directory, sharing.daemon) == ("running", str(pipe), None)
    assert "not started by sieve" in sharing.reason
    assert environ.get(mps.PIPE_ENV) == (str(pipe) if given else None)  # CUDA's default needs no export
    sharing.stop(environ)
    assert calls(tools) == [] and (pipe / "control").exists() and list(private_tmp.iterdir()) == []


def test_a_pipe_directory_without_a_daemon_gets_one_of_sieves_own(tmp_path, private_tmp):
    """The workers look only in CUDA_MPS_PIPE_DIRECTORY once it is set: a daemon in the default directory does not
    count then, and the daemon sieve starts replaces the setting."""
    tools, default = stand_in(tmp_path / "bin"), tmp_path / "default"
    default.mkdir()
    (default / "control").write_text("")
    environ = {"PATH": str(tools), mps.PIPE_ENV: str(tmp_path / "empty")}
    sharing = mps.share_gpu("auto", "cuda", 2, environ, default_pipe=default)
    assert sharing.state == "started" and environ[mps.PIPE_ENV] == sharing.pipe_directory != str(tmp_path / "empty")
    sharing.stop(environ)


def test_on_without_the_binary_refuses_to_start(tmp_path, private_tmp):
    environ = {"PATH": str(tmp_path)}
    with pytest.raises(SystemExit, match=r"^sieve: SIEVE_CUDA_MPS=on but nvidia-cuda-mps-control is not on PATH"):
        mps.share_gpu("on", "cuda", 8, environ, default_pipe=tmp_path / "none")
    assert mps.STATE_ENV not in environ


def test_auto_without_the_binary_warns_once_and_time_slices(tmp_path, private_tmp, caplog):
    environ = {"PATH": str(tmp_path)}
    with caplog.at_level(logging.INFO, logger="sieve.workers"):
        sharing = mps.share_gpu("auto", "cuda", 8, environ, default_pipe=tmp_path / "none")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "8 workers will time-slice the GPU" in warnings[0] and "1,732" in warnings[0]
    assert sharing.state == "unavailable" and mps.PIPE_ENV not in environ
    assert json.loads(environ[mps.STATE_ENV])["state"] == "unavailable"


def test_a_daemon_whose_socket_never_appears_is_reported_and_skipped(tmp_path, private_tmp, caplog):
    tools = stand_in(tmp_path / "bin", broken=True)
    environ = {"PATH": str(tools)}
    with caplog.at_level(logging.WARNING, logger="sieve.workers"):
        sharing = mps.share_gpu("auto", "cuda", 8, environ, default_pipe=tmp_path / "none", wait_s=0.3)
    assert sharing.state == "unavailable" and sharing.daemon is None and mps.PIPE_ENV not in environ
    assert "no control socket" in sharing.reason and "cannot open /dev/nvidiactl" in sharing.reason  # its log
    assert any("cannot open /dev/nvidiactl" in r.getMessage() for r in caplog.records)
    assert [c["args"] for c in calls(tools)] == [["-d"], []]  # told to quit in case it comes up late
    assert list(private_tmp.iterdir()) == []
    with pytest.raises(SystemExit, match="cannot open /dev/nvidiactl"):
        mps.share_gpu("on", "cuda", 8, {"PATH": str(tools)}, default_pipe=tmp_path / "none", wait_s=0.3)


@pytest.fixture()
def restored_environ():
    """serve() writes the workers' settings into this process's environment: put it back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_serve_starts_the_daemon_before_the_workers_and_stops_it_when_they_fail(tmp_path, private_tmp, monkeypatch,
                                                                               restored_environ):
    """The workers are spawned (Supervisor.run) with the daemon up and its pipe directory in their environment;
    when the supervisor ends, even by an exception, the daemon is told to quit and its directories go."""
    tools = stand_in(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    for name in (mps.PIPE_ENV, mps.LOG_ENV, mps.STATE_ENV, workers.METRICS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(mps, "DEFAULT_PIPE", tmp_path / "no-daemon")
    seen = {}

    class Spawner:
        def __init__(self, config, sockets, metrics_dir, per_worker=False):
            self.sockets = sockets

        def run(self):
            for sock in self.sockets:
                sock.close()
            pipe = os.environ[mps.PIPE_ENV]
            seen.update(pipe=pipe, up=(Path(pipe) / "control").exists(), state=json.loads(os.environ[mps.STATE_ENV]))
            raise RuntimeError("a worker failed")

    monkeypatch.setattr(supervisor, "Supervisor", Spawner)
    settings = Settings(workers=2, device="cuda", port=free_port())
    with pytest.raises(RuntimeError, match="a worker failed"):
        supervisor.serve(settings, workers.Plan(2, "SIEVE_WORKERS"))
    assert seen["up"] and seen["state"] == {"state": "started", "pipe_directory": seen["pipe"],
                                            "reason": seen["state"]["reason"]}
    assert [(c["args"], c["pipe"]) for c in calls(tools)] == [(["-d"], seen["pipe"]), ([], seen["pipe"])]
    assert list(private_tmp.iterdir()) == []  # the daemon's directories and the metrics directory


def test_sieve_serve_with_on_and_no_mps_ends_with_one_line(tmp_path):
    """The CLI's refusal: exit status 1, one line naming the setting, no traceback, no worker started."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "SIEVE_CUDA_MPS": "on", "SIEVE_DEVICE": "cuda",
           "SIEVE_WORKERS": "2", "SIEVE_PORT": str(free_port()), "SIEVE_INDEX_DIR": str(tmp_path / "index")}
    env[mps.PIPE_ENV] = str(tmp_path / "no-daemon")  # not a daemon this machine may run in CUDA's default one
    done = subprocess.run([sys.executable, "-m", "sieve.cli", "serve"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "SIEVE_CUDA_MPS=on but nvidia-cuda-mps-control is not on PATH" in done.stderr
    assert "Traceback" not in done.stderr and "starting 2 workers" in done.stderr


def test_a_single_process_reports_no_mps_decision(client):
    """`sieve serve` with one process (the suite's servers) does what it did before: no MPS, `workers.mps` null."""
    assert client.get("/readyz").json()["workers"]["mps"] is None
