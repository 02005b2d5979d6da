"""Starts a real `sieve serve` process (uvicorn) on a free loopback port for HTTP tests."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def named(env: dict[str, str], key: str) -> bool:
    """Whether the test chose this model itself (SIEVE_CROSS_ENCODER_ENABLED is implied by a CE path)."""
    return key in env or (key == "SIEVE_CROSS_ENCODER_ENABLED" and "SIEVE_CROSS_ENCODER_PATH" in env)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# What a test server runs unless its test names a model: the identity CMC (ranks as the bi-encoder, so tests can
# pin rankings) and no cross-encoder (each one would cost seconds per request on a CPU). The shipped trained
# defaults (checkpoints/) are served by the tests that ask for them with shipped_models=True.
MINIMAL_MODELS = {"SIEVE_CMC_PATH": "untrained", "SIEVE_CROSS_ENCODER_ENABLED": "false"}


class Server:
    def __init__(self, env: dict[str, str], log_path: Path, timeout_s: float = 900, shipped_models: bool = False,
                 cwd: Path = REPO, until: str = "/readyz"):
        """`cwd`: the tree whose `sieve` is served (`python -m` imports from the working directory first); `until`:
        the path that must answer 200 before the server counts as started (/healthz: up, though maybe not ready)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        minimal = {} if shipped_models else {k: v for k, v in MINIMAL_MODELS.items() if not named(env, k)}
        full_env = {**os.environ, "SIEVE_HOST": "127.0.0.1", "SIEVE_PORT": str(self.port), **minimal, **env}
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "sieve.cli", "serve"], cwd=cwd, env=full_env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready(timeout_s, until)

    def wait_ready(self, timeout_s: float, until: str = "/readyz") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.url}{until}", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout_s}s:\n{self.log_path.read_text()[-4000:]}")

    def client(self, timeout: float = 120, local_address: str | None = None) -> httpx.Client:
        """`local_address`: connect from this loopback address (127.0.0.N), a client address of the test's own."""
        transport = httpx.HTTPTransport(local_address=local_address) if local_address else None
        return httpx.Client(base_url=self.url, timeout=timeout, transport=transport)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
