"""A SIEVE_* variable (or the flag that sets it) out of range ends any command with one line per setting, named as
the operator sets it, before anything is loaded: never pydantic's traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest

from sieve import cli


def test_an_invalid_variable_is_named_with_what_it_was_given_and_what_it_takes(tmp_path, monkeypatch):
    monkeypatch.setenv("SIEVE_PRECISION", "bf16")
    monkeypatch.setenv("SIEVE_WORKERS", "0")
    monkeypatch.setattr(cli, "encoders", lambda *_, **__: pytest.fail("models were loaded"))
    with pytest.raises(SystemExit) as ended:
        cli.main(["serve", "--index", str(tmp_path / "index")])
    lines = str(ended.value).splitlines()
    assert "sieve: invalid setting SIEVE_PRECISION='bf16': Input should be 'auto' or 'fp32'" in lines
    assert any(line.startswith("sieve: invalid setting SIEVE_WORKERS='0'") for line in lines), lines
    assert len(lines) == 2


def test_a_flag_out_of_range_ends_the_command_without_a_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sieve.cli", "serve", "--index", str(tmp_path), "--port", "99999"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == \
        "sieve: invalid setting SIEVE_PORT=99999: Input should be less than or equal to 65535"
