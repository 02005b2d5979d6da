"""Alerts that fire, not only load: the real Prometheus scrapes a real Sieve whose own Redis is then killed, and
SieveRedisDown must go pending and then firing (and be inactive while Redis is up); a Sieve with room for one
request at a time is flooded, and SieveOverloaded must fire. The rules are those of deploy/prometheus/alerts.yml with
the tested alert's `for:` shortened to 2 s so the test takes seconds; the expressions are unchanged."""
from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml

from tests.server import Server, free_port
from tests.service.test_observability import ALERTS, prometheus_binary

FOR = "2s"


def rules_with_short_for(path: Path, alert: str) -> Path:
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == alert:
                rule["for"] = FOR
    path.write_text(yaml.safe_dump(rules))
    return path


def start_prometheus(target: str, rule_file: Path, tmp_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rule_file)],
              "scrape_configs": [{"job_name": "sieve", "static_configs": [{"targets": [target]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([prometheus_binary(), f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=open(tmp_path / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def prometheus_api(prom: str, path: str, **params) -> dict | None:
    """The API answer's data, or None while Prometheus is not up or not ready yet (it answers 503 'Service
    Unavailable', not JSON, until its storage is open)."""
    try:
        response = httpx.get(f"{prom}{path}", params=params, timeout=5)
    except httpx.TransportError:
        return None
    return response.json()["data"] if response.status_code == 200 else None


def alert_state(prom: str, name: str) -> str:
    data = prometheus_api(prom, "/api/v1/alerts")
    if data is None:
        return "no prometheus yet"
    alerts = data["alerts"]
    return next((a["state"] for a in alerts if a["labels"]["alertname"] == name), "inactive")


def redis_up_seen(prom: str) -> list[float]:
    data = prometheus_api(prom, "/api/v1/query", query="sieve_redis_up")
    return [] if data is None else [float(r["value"][1]) for r in data["result"]]


def poll(condition, within_s: float, what: str, tick=lambda: None) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        tick()
        time.sleep(0.2)


def test_redis_down_alert_fires_when_redis_is_killed(own_redis, demo_index, tmp_path):
    redis_proc, port = own_redis
    server = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
                     "SIEVE_REDIS_TIMEOUT_MS": "50", "SIEVE_REDIS_RETRY_S": "1"}, tmp_path / "server.log")
    prom_proc, prom = start_prometheus(server.url.split("//")[1],
                                       rules_with_short_for(tmp_path / "alerts.yml", "SieveRedisDown"), tmp_path)
    searches = iter(range(10**6))

    def search():  # a Redis call (cache look-up of a fresh query) sets sieve_redis_up from its outcome
        httpx.post(f"{server.url}/search", json={"query": f"volcano {next(searches)}", "top_k": 3}, timeout=30)

    try:
        poll(lambda: redis_up_seen(prom) == [1.0], 60, "Prometheus scrapes sieve_redis_up 1", search)
        assert alert_state(prom, "SieveRedisDown") == "inactive"
        redis_proc.kill()
        redis_proc.wait()
        states = set()

        def firing() -> bool:
            states.add(alert_state(prom, "SieveRedisDown"))
            return "firing" in states

        poll(firing, 60, "SieveRedisDown firing after Redis was killed", search)
        print(f"\nSieveRedisDown states seen after the kill: {sorted(states)}")
    finally:
        prom_proc.terminate()
        prom_proc.wait(30)
        server.stop()


def test_overloaded_alert_fires_when_requests_are_refused_for_max_inflight(demo_index, tmp_path):
    """SIEVE_MAX_INFLIGHT=1 and 8 clients searching at once: most answers are 429 `overloaded`. The rule's
    rate over [5m] must pass 1/s, so the flood goes on (a few hundred cheap refusals) until the alert fires."""
    server = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_MAX_INFLIGHT": "1", "SIEVE_CACHE_ENABLED": "false"},
                    tmp_path / "server.log")
    prom_proc, prom = start_prometheus(server.url.split("//")[1],
                                       rules_with_short_for(tmp_path / "alerts.yml", "SieveOverloaded"), tmp_path)
    statuses: list[int] = []

    def client(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for i in range(25):
                statuses.append(http.post("/search", json={"query": f"volcano {n} {i}", "top_k": 3}).status_code)

    def flood() -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(client, range(8)))

    try:
        poll(lambda: alert_state(prom, "SieveOverloaded") == "inactive", 60, "Prometheus evaluates the rules")
        states = set()

        def firing() -> bool:
            states.add(alert_state(prom, "SieveOverloaded"))
            return "firing" in states

        poll(firing, 120, "SieveOverloaded firing under a flood of 429s", flood)
        assert statuses.count(429) > 300 and 200 in statuses, (statuses.count(429), len(statuses))
        print(f"\nSieveOverloaded states seen: {sorted(states)}; {statuses.count(429)} of {len(statuses)} were 429")
    finally:
        prom_proc.terminate()
        prom_proc.wait(30)
        server.stop()
