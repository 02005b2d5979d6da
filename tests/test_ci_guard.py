"""The CI guard (tests/ci_guard.py) run on a throw-away suite in a pytest subprocess: with CI set, every kind of
skip fails and a not_in_ci test is skipped; without CI, skips stay skips and the marked test runs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = {
    "test_skips.py": '''
import pytest

def test_skips_inside():
    pytest.skip("no widget here")

@pytest.mark.skip(reason="marked away")
def test_marked_skip():
    pass

@pytest.mark.skipif(True, reason="condition")
def test_skipif():
    pass

@pytest.mark.xfail(reason="known bug", strict=True)
def test_expected_failure():
    assert False

@pytest.mark.not_in_ci(reason="needs a person at the keyboard")
def test_interactive():
    pass

def test_plain():
    pass
''',
    "test_module_skip.py": '''
import pytest
pytest.importorskip("a_module_that_is_not_installed_anywhere")

def test_never_collected():
    pass
''',
}


def run_suite(tmp_path: Path, ci: bool) -> tuple[int, str]:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(REPO)}
    if ci:
        env["CI"] = "true"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.ci_guard", "-rA", "-p", "no:cacheprovider",
                           "--continue-on-collection-errors", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def outcome(output: str, word: str, test: str) -> bool:
    """Whether pytest's summary (-rA) has a line `word ... test` (a skip in setup reads ERROR, in the body FAILED)."""
    words = ("FAILED", "ERROR") if word == "failed" else (word,)
    return any(line.startswith(words) and test in line for line in output.splitlines())


def test_under_ci_every_skip_fails_and_only_not_in_ci_is_skipped(tmp_path):
    status, output = run_suite(tmp_path, ci=True)
    assert status == 1, output
    for test in ("test_skips_inside", "test_marked_skip", "test_skipif", "test_module_skip.py"):
        assert outcome(output, "failed", test), output
    assert "skipped although CI is set (Skipped: no widget here)" in output
    assert outcome(output, "SKIPPED", "not in CI: needs a person at the keyboard"), output
    assert outcome(output, "XFAIL", "test_expected_failure") and outcome(output, "PASSED", "test_plain"), output


def test_without_ci_skips_stay_skips_and_not_in_ci_tests_run(tmp_path):
    status, output = run_suite(tmp_path, ci=False)
    assert status == 0 and not outcome(output, "failed", "test_"), output
    assert outcome(output, "PASSED", "test_interactive") and outcome(output, "PASSED", "test_plain"), output
    assert outcome(output, "SKIPPED", "no widget here"), output
