"""A skip in CI is a failure: with the environment variable CI set (.ci/run sets it), a test or module that skips
fails instead, naming the reason, unless it says it must not run in CI with @pytest.mark.not_in_ci(reason=...).
Such a test is skipped in CI (the reason shown) and runs everywhere else. Loaded by tests/conftest.py."""
from __future__ import annotations

import os

import pytest

MARKER = "not_in_ci"


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(reason): the test must not run in CI; there it is skipped, not failed")


def pytest_collection_modifyitems(config, items) -> None:
    if not in_ci():
        return
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None:
            reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else None)
            if not reason:
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER} needs a reason")
            item.add_marker(pytest.mark.skip(reason=f"not in CI: {reason}"))


def as_failure(report, where: str) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"{where} skipped although CI is set ({reason}). Make it run in CI, or mark it "
                       f"@pytest.mark.{MARKER}(reason=...) if it must not.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker(MARKER) is None:
        as_failure(report, "the test")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Skips at import time (pytest.importorskip or pytest.skip at module level) skip a whole module."""
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped:
        as_failure(report, f"{collector.nodeid or 'a collector'} was")
