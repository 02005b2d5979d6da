"""The real Prometheus (Debian package `prometheus`, run by hand on a free port with a temporary config and store)
scrapes a running Sieve; every Grafana panel expression and every alert signal must evaluate and return data, and
the alert rules must load."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.server import REPO, free_port
from tests.service.conftest import auth

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "sieve.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
COMPARISON = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*[-+]?[\d.]+(e[-+]?\d+)?\s*$")


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("the prometheus binary is missing in CI (.ci/run installs the Debian package)")
        pytest.skip("prometheus is not installed (apt-get install -y prometheus); .ci/run installs it in CI")
    return binary


@pytest.fixture()
def prometheus(guarded_server, tmp_path):
    binary = prometheus_binary()
    port = free_port()
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(ALERTS)],
              "scrape_configs": [{"job_name": "sieve", "metrics_path": "/metrics",
                                  "static_configs": [{"targets": [guarded_server.url.split("//")[1]]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)  # not up, or up but not ready (503) yet
        else:
            pytest.fail(f"prometheus did not start:\n{(tmp_path / 'prometheus.log').read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def traffic(server, fresh_key, fresh_address) -> float:
    """Every kind of request the panels show: searches (cache miss and hit), a partial answer, /rerank, a write,
    client errors and an unauthorised call. Each request under a key of its own, so the 5/s limit never answers
    instead. Returns when it ended (Unix time)."""
    requests = [("post", "/search", {"query": "observability of volcanoes", "top_k": 3}),
                ("post", "/search", {"query": "observability of volcanoes", "top_k": 3}),
                ("post", "/search", {"query": "late answer", "timeout_ms": 1}),
                ("post", "/rerank", {"query": "bread", "documents": ["Knead dough.", "Rome."]}),
                ("post", "/search", {"query": ""}),
                ("post", "/documents", {"documents": [{"id": f"obs-{time.time_ns()}", "text": "Metrics text."}]})]
    with server.client() as client:
        for method, path, body in requests:
            getattr(client, method)(path, json=body, headers=auth(fresh_key()))
    with server.client(local_address=fresh_address()) as stranger:  # failed keys spend the address's bucket
        stranger.post("/search", json={"query": "no key"})
    return time.time()


def scraped_after(prom: str, moment: float, timeout_s: float = 60) -> None:
    """Waits until Prometheus has stored a scrape that began after `moment`. A target's lastScrape is reported just
    before that scrape's samples are committed, so this waits for the one after it too."""
    deadline = time.monotonic() + timeout_s
    for _ in range(2):
        while (last := last_scrape(prom)) <= moment:
            if time.monotonic() > deadline:
                pytest.fail(f"no scrape after {moment} within {timeout_s} s")
            time.sleep(0.2)
        moment = last


def last_scrape(prom: str) -> float:
    """When the last successful scrape began (Unix time); 0 before the first (or while no target is listed yet)."""
    targets = httpx.get(f"{prom}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    if not targets or targets[0]["health"] != "up" or targets[0]["lastScrape"].startswith("0001"):
        return 0.0
    return iso_seconds(targets[0]["lastScrape"])


def iso_seconds(stamp: str) -> float:
    """Prometheus' RFC 3339 time (nanosecond digits, Z or an offset) as Unix seconds."""
    from datetime import datetime

    match = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", stamp)
    assert match, stamp
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    return datetime.fromisoformat(match.group(1) + zone).timestamp() + float(match.group(2) or 0)


def query(prom: str, expr: str) -> list:
    body = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"].replace("$__rate_interval", "1m") for p in panels for t in p["targets"]]


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def test_dashboard_and_alert_expressions_return_data(guarded_server, prometheus, fresh_key, fresh_address):
    scraped_after(prometheus, traffic(guarded_server, fresh_key, fresh_address))  # scrapes on both sides of the
    scraped_after(prometheus, traffic(guarded_server, fresh_key, fresh_address))  # second traffic: rate() has data
    targets = httpx.get(f"{prometheus}/api/v1/targets").json()["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
    empty = [expr for expr in dashboard_expressions() if not query(prometheus, expr)]
    assert not empty, f"dashboard panels without data: {empty}"
    for rule in alert_rules():
        query(prometheus, rule["expr"])  # the whole rule evaluates
        signal = COMPARISON.sub("", rule["expr"])
        assert signal != rule["expr"], f"{rule['alert']}: expected '<signal> <comparison> <threshold>'"
        assert query(prometheus, signal), f"{rule['alert']}: {signal} returns no data"
    # The ratios measure this traffic, not a default: no 5xx was answered, and one of several /search and /rerank
    # answers was partial.
    signals = {r["alert"]: COMPARISON.sub("", r["expr"]) for r in alert_rules()}
    assert [float(s["value"][1]) for s in query(prometheus, signals["SieveErrorRate"])] == [0.0]
    partial = [float(s["value"][1]) for s in query(prometheus, signals["SievePartialResponses"])]
    assert len(partial) == 1 and 0 < partial[0] < 1, partial
    groups = httpx.get(f"{prometheus}/api/v1/rules").json()["data"]["groups"]
    loaded = {r["name"]: r["health"] for g in groups for r in g["rules"]}
    assert set(loaded) == {r["alert"] for r in alert_rules()} and set(loaded.values()) == {"ok"}, loaded
