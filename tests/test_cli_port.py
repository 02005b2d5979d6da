"""`sieve demo` / `sieve serve` on a port that is taken end at once with one line naming the setting, before any
model is loaded (it once loaded models for 30 s, then died with `address already in use`)."""
from __future__ import annotations

import socket

import pytest

from sieve import cli
from tests.conftest import DEMO_CORPUS


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_a_taken_port_is_named_before_loading_anything(command, tmp_path, monkeypatch):
    def no_models(*_, **__):
        raise AssertionError("models were loaded although the port is taken")

    monkeypatch.setattr(cli, "encoders", no_models)
    from sieve.service import components
    monkeypatch.setattr(components, "load_components", no_models)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--corpus", str(DEMO_CORPUS)] if command == "demo" else []
        with pytest.raises(SystemExit) as ended:
            cli.main([command, *extra, "--index", str(tmp_path / "index"), "--host", "127.0.0.1", "--port", str(port)])
    assert f"127.0.0.1:{port}" in str(ended.value) and "SIEVE_PORT" in str(ended.value)
