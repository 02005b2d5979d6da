"""Deploy files agree with the code: Dockerfile, .dockerignore, docker-compose.yml, Prometheus config, demo corpus.

No Docker engine runs here, so these tests read the files and check them against the sources of truth they depend on
(pyproject.toml, service.config.Settings, the routes the app declares). Whether the images build is not checked here.
"""
from __future__ import annotations

import ast
import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import kubernetes_validate as kv  # the [test] extra: imported, never skipped
import pytest
import yaml

from sieve.service.config import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DEMO_CORPUS = ROOT / "sieve" / "demo_corpus.jsonl"
APP_SERVICE = "sieve"  # the compose service that runs the Dockerfile's image
CE_SERVICE = "sieve-ce"  # the same image serving only its cross-encoder, called by APP_SERVICE (SIEVE_CE_URL)
SIEVE_VAR = re.compile(r"\bSIEVE_[A-Z0-9_]+")
COMPOSE_DEFAULT = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")  # ${VAR:-default} / ${VAR-default} / ${VAR}


# ---------------------------------------------------------------- parsing helpers

def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comment lines dropped and backslash continuations joined."""
    logical, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not current):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    if current.strip():
        logical.append(current)
    pairs = []
    for line in logical:
        instruction, _, args = line.strip().partition(" ")
        pairs.append((instruction.upper(), args.strip()))
    return pairs


def exec_or_shell_words(args: str) -> list[str]:
    """CMD/ENTRYPOINT/COPY arguments in JSON (exec) form or plain shell words."""
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def copy_sources(instructions) -> list[str]:
    sources = []
    for instruction, args in instructions:
        if instruction not in ("COPY", "ADD"):
            continue
        words = [w for w in shlex.split(args) if not w.startswith("--")] if not args.startswith("[") else json.loads(args)
        assert len(words) >= 2, f"{instruction} {args}: needs a source and a destination"
        assert not any(w.startswith("--from") for w in shlex.split(args)), "single-stage image: no COPY --from"
        sources += words[:-1]
    return sources


def dockerfile_env(instructions) -> dict[str, str]:
    env = {}
    for instruction, args in instructions:
        if instruction != "ENV":
            continue
        words = shlex.split(args)
        if "=" in words[0]:
            env.update(w.split("=", 1) for w in words)
        else:  # legacy `ENV KEY value with spaces`
            env[words[0]] = " ".join(words[1:])
    return env


def only(instructions, name: str) -> str:
    found = [args for instruction, args in instructions if instruction == name]
    assert len(found) == 1, f"expected exactly one {name}, found {len(found)}"
    return found[0]


def compose_value(value) -> str:
    """A compose string with ${VAR:-default} interpolated to its default, as on a machine with none of them set."""
    return COMPOSE_DEFAULT.sub(lambda m: m.group(2) or "", str(value))


def container_port(mapping) -> int:
    if isinstance(mapping, dict):
        return int(mapping["target"])
    return int(str(mapping).split("/")[0].rsplit(":", 1)[-1])


def declared_routes() -> set[str]:
    """Paths of every `@<router or app>.<method>("/path")` decorator in service/*.py (parsed, not imported: no models)."""
    paths = set()
    for source in (ROOT / "sieve" / "service").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for deco in node.decorator_list:
                    if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.args
                            and isinstance(deco.args[0], ast.Constant) and isinstance(deco.args[0].value, str)):
                        paths.add(deco.args[0].value)
    return paths


def healthcheck_text(check) -> str:
    return " ".join(check) if isinstance(check, list) else str(check)


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), f"unparsable duration {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def docker():
    return dockerfile_instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def app_port(docker) -> int:
    return int(only(docker, "EXPOSE").split("/")[0])


# ---------------------------------------------------------------- (a) COPY sources

def test_every_copied_path_exists(docker):
    sources = copy_sources(docker)
    assert sources, "the Dockerfile copies nothing"
    missing = [s for s in sources if not any(ROOT.glob(s))]
    assert not missing, f"Dockerfile COPYs paths that are not in the repository: {missing}"


def test_dependency_layer_has_the_readme_pyproject_names(docker, pyproject):
    """`pip install .` reads project.readme; it must be in the image before the install runs."""
    readme = pyproject["project"]["readme"]
    readme = readme["file"] if isinstance(readme, dict) else readme
    assert readme in copy_sources(docker)
    first_copy = next(args for instruction, args in docker if instruction == "COPY")
    assert "pyproject.toml" in shlex.split(first_copy) and readme in shlex.split(first_copy), \
        "first COPY should be the dependency layer: pyproject.toml + readme only"


def test_copied_packages_cover_their_local_imports(docker):
    """Every repo package imported by code the image ships is shipped too (else the container dies on import)."""
    copied = {Path(s).parts[0] for s in copy_sources(docker) if (ROOT / s).is_dir()}
    local = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    needed = set()
    for package in copied:
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    needed.add(node.module.split(".")[0])
                elif isinstance(node, ast.Import):
                    needed.update(alias.name.split(".")[0] for alias in node.names)
    assert copied, "the Dockerfile copies no package directories"
    assert not (needed & local) - copied, f"imported but not copied into the image: {sorted((needed & local) - copied)}"


def test_dockerignore_keeps_what_the_dockerfile_copies(docker):
    patterns = [p.strip().rstrip("/") for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#") and not p.startswith("!")]
    assert ".venv" in patterns and ".git" in patterns, ".dockerignore must keep the venv and git history out"
    paths = []
    for source in copy_sources(docker):
        paths.append(source)
        if (ROOT / source).is_dir():
            paths += [str(f.relative_to(ROOT)) for f in (ROOT / source).rglob("*")
                      if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"]
    ignored = [(path, pat) for path in paths for pat in patterns
               if fnmatch.fnmatch(path, pat) or any(fnmatch.fnmatch(str(parent), pat) for parent in Path(path).parents)]
    assert not ignored, f".dockerignore drops files the image needs: {ignored[:5]}"


# ---------------------------------------------------------------- (b) CMD is a console script

def test_cmd_runs_a_project_script(docker, pyproject):
    entrypoint = [args for instruction, args in docker if instruction == "ENTRYPOINT"]
    command = exec_or_shell_words(entrypoint[-1] if entrypoint else only(docker, "CMD"))
    scripts = pyproject["project"]["scripts"]
    assert command[0] in scripts, f"image runs {command[0]!r}, not one of [project.scripts] {sorted(scripts)}"


def test_cmd_arguments_parse_with_the_cli(docker):
    from sieve.cli import build_parser

    command = exec_or_shell_words(only(docker, "CMD"))
    args = build_parser().parse_args(command[1:])  # SystemExit (a test error) on an unknown subcommand
    assert args.command == "demo"


# ---------------------------------------------------------------- (c) SIEVE_* names are Settings fields

def test_every_sieve_variable_is_a_settings_field():
    fields = set(Settings.model_fields)
    for path in (DOCKERFILE, COMPOSE):
        names = set(SIEVE_VAR.findall(path.read_text()))
        assert names, f"{path.name} sets no SIEVE_* variable"
        unknown = sorted(n for n in names if n.removeprefix("SIEVE_").lower() not in fields)
        assert not unknown, f"{path.name} uses SIEVE_* names Settings does not have: {unknown}"


def service_settings(docker, compose, name: str) -> Settings:
    """The Settings a compose service running the image starts with (the image's ENV, then the service's)."""
    env = {k: v for k, v in dockerfile_env(docker).items() if k.startswith("SIEVE_")}
    env.update({k: compose_value(v) for k, v in compose["services"][name]["environment"].items()
                if k.startswith("SIEVE_")})
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        settings = Settings()
    assert str(settings.index_dir) == env["SIEVE_INDEX_DIR"]
    return settings


@pytest.mark.parametrize("name", [APP_SERVICE, CE_SERVICE])
def test_deploy_environment_values_validate(docker, compose, name):
    """The values, not only the names: Settings must accept what the image and compose set."""
    settings = service_settings(docker, compose, name)
    assert settings.host == "0.0.0.0", "inside a container the server must bind all interfaces"


# ---------------------------------------------------------------- (d) one port everywhere

def test_published_port_matches_expose_and_sieve_port(docker, compose, app_port):
    service = compose["services"][APP_SERVICE]
    published = {container_port(p) for p in service["ports"]}
    assert published == {app_port}, f"compose publishes container port(s) {published}, Dockerfile EXPOSEs {app_port}"
    assert int(dockerfile_env(docker)["SIEVE_PORT"]) == app_port
    compose_port = service.get("environment", {}).get("SIEVE_PORT")
    assert compose_port is None or int(compose_value(compose_port)) == app_port


def test_health_probes_hit_declared_routes_on_the_app_port(docker, compose, app_port):
    routes = declared_routes()
    assert {"/healthz", "/readyz", "/metrics"} <= routes, f"app routes: {sorted(routes)}"
    docker_check = only(docker, "HEALTHCHECK")
    assert "/healthz" in docker_check and "urllib" in docker_check
    compose_check = healthcheck_text(compose["services"][APP_SERVICE]["healthcheck"]["test"])
    assert f":{app_port}/readyz" in compose_check and "urllib" in compose_check


# ---------------------------------------------------------------- (e) health checks everywhere

def test_every_compose_service_has_a_healthcheck(compose):
    services = compose["services"]
    assert {APP_SERVICE, CE_SERVICE, "redis", "prometheus"} <= set(services)
    for name, service in services.items():
        check = service.get("healthcheck") or {}
        assert not check.get("disable"), f"{name}: healthcheck disabled"
        test = check.get("test")
        assert test and test != ["NONE"], f"{name}: no healthcheck test"


def test_app_start_period_covers_first_index_build(compose):
    assert seconds(compose["services"][APP_SERVICE]["healthcheck"]["start_period"]) >= 600


def test_bind_mounts_exist(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith((".", "/")):
                assert (ROOT / source).resolve().exists(), f"{name}: mounts missing {source}"
            else:
                assert source in (compose.get("volumes") or {}), f"{name}: named volume {source} is not declared"


def test_compose_front_calls_the_cross_encoder_service(docker, compose, app_port):
    """The front's SIEVE_CE_URL names the CE service on the port it serves; that service runs `sieve serve` with a
    cross-encoder loaded in-process (not another remote), probes /readyz, and starts once the front built the index."""
    from sieve.cli import build_parser
    from sieve.pipeline.remote_ce import endpoint_url

    front, ce = service_settings(docker, compose, APP_SERVICE), service_settings(docker, compose, CE_SERVICE)
    url = endpoint_url(front.ce_url, front.ce_shape)
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    assert host == CE_SERVICE and int(port) == ce.port == app_port
    assert front.ce_shape == "sieve" and url.endswith("/rerank") and "/rerank" in declared_routes()
    service = compose["services"][CE_SERVICE]
    assert build_parser().parse_args(service["command"][1:]).command == "serve"
    assert service["image"] == compose["services"][APP_SERVICE]["image"]
    assert ce.ce_url is None and ce.cross_encoder_enabled and ce.resolved_cross_encoder_path() is not None
    assert f":{ce.port}/readyz" in healthcheck_text(service["healthcheck"]["test"])
    assert service["depends_on"][APP_SERVICE]["condition"] == "service_healthy"
    assert "sieve-data:/data" in service["volumes"] and str(ce.index_dir).startswith("/data/")


# ---------------------------------------------------------------- (f) Prometheus scrapes the app

def test_prometheus_scrapes_the_app_service(compose, app_port):
    config = yaml.safe_load(PROMETHEUS.read_text())
    targets = [(job, target) for job in config["scrape_configs"]
               for static in job.get("static_configs", []) for target in static["targets"]]
    assert targets, "prometheus.yml has no static targets"
    for job, target in targets:
        host, port = target.rsplit(":", 1)
        assert host in compose["services"], f"scrape target host {host!r} is not a compose service"
        assert host != APP_SERVICE or int(port) == app_port, f"{target}: the app listens on {app_port}"
        assert job.get("metrics_path", "/metrics") in declared_routes()
    assert any(target == f"{APP_SERVICE}:{app_port}" for _, target in targets)
    interval = next(job for job, t in targets if t.startswith(APP_SERVICE)).get(
        "scrape_interval", config.get("global", {}).get("scrape_interval", "1m"))
    assert seconds(interval) == 5


# ---------------------------------------------------------------- (g) the demo corpus

def test_demo_corpus_is_valid_beir():
    docs = [json.loads(line) for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(docs) >= 50
    ids = [doc["_id"] for doc in docs]
    assert len(set(ids)) == len(ids), "duplicate _id in the demo corpus"
    for doc in docs:
        assert isinstance(doc["_id"], str) and doc["_id"], doc
        assert isinstance(doc.get("title"), str) and doc["title"].strip(), f"{doc['_id']}: empty title"
        assert isinstance(doc.get("text"), str) and doc["text"].strip(), f"{doc['_id']}: empty text"
    topics = {i.rsplit("-", 1)[0] for i in ids}
    assert len(topics) >= 8, f"demo corpus should span distinct topics, found {sorted(topics)}"


def test_demo_corpus_is_the_one_the_cli_ships(pyproject):
    """`sieve demo` in the image reads it from the installed package, so it must be package data too."""
    from sieve.cli import DEMO_CORPUS as cli_corpus

    assert cli_corpus.resolve() == DEMO_CORPUS.resolve()
    package_data = pyproject["tool"]["setuptools"]["package-data"]["sieve"]
    assert any(fnmatch.fnmatch(DEMO_CORPUS.name, pattern) for pattern in package_data)


# ---------------------------------------------------------------- (h) Grafana, alerts, Redis in compose

GRAFANA = ROOT / "deploy" / "grafana"
K8S = ROOT / "deploy" / "k8s"


def test_compose_sieve_uses_the_redis_service(compose):
    sieve = compose["services"][APP_SERVICE]
    url = compose_value(sieve["environment"]["SIEVE_REDIS_URL"])
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    assert host in compose["services"] and int(port) == 6379
    assert sieve["depends_on"][host]["condition"] == "service_healthy"


def test_prometheus_rule_files_are_mounted_where_the_config_reads_them(compose):
    config = yaml.safe_load(PROMETHEUS.read_text())
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["prometheus"]["volumes"]}
    for rule_file in config["rule_files"]:
        assert rule_file in mounts, f"{rule_file} is not mounted into the prometheus container"
        assert (ROOT / mounts[rule_file]).is_file()
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"SieveSearchLatencySLO", "SieveErrorRate", "SieveRedisDown"} <= names


def test_grafana_is_provisioned_with_the_dashboard_and_the_prometheus_datasource(compose):
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    provisioning = ROOT / mounts["/etc/grafana/provisioning"]
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    host, port = datasource["url"].split("//")[1].split(":")
    assert host in compose["services"] and int(port) == 9090
    provider = yaml.safe_load((provisioning / "dashboards" / "sieve.yml").read_text())["providers"][0]
    dashboards = ROOT / mounts[provider["options"]["path"]]
    dashboard = json.loads((dashboards / "sieve.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {datasource["uid"]}
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("p50", "p95", "p99", "requests per second", "status code", "cache hit", "batch size", "candidates",
                  "partial", "bm25"):
        assert topic in titles, f"the dashboard has no panel about {topic}"



def test_no_alert_or_panel_papers_over_a_missing_series_with_a_constant():
    """`or vector(0)` turns a renamed or never-exported metric into a quiet 0: the alert can never fire and the
    panel looks healthy. tests/service/test_observability.py checks each expression on real data instead."""
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "sieve.json").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) > 10
    padded = [e for e in exprs if re.search(r"\bor\s+(on\s*\(\)\s*)?vector\(", e)]
    assert not padded, padded


# ---------------------------------------------------------------- (i) Kubernetes manifests

K8S_APPS = {"sieve": "sieve-config", "sieve-ce": "sieve-ce-config"}  # Deployment -> its ConfigMap


def k8s_documents() -> dict[tuple[str, str], dict]:
    """(kind, name) -> object, over every document of every manifest."""
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in docs, f"{key} defined twice"
            docs[key] = doc
    return docs


def test_k8s_manifests_validate_against_the_kubernetes_schemas():
    """kubernetes-validate ships the official OpenAPI-derived JSON schemas; strict = unknown fields are errors."""
    docs = k8s_documents()
    assert set(docs) == {("PersistentVolumeClaim", "sieve-data")} | {
        (kind, app) for app in K8S_APPS for kind in ("Deployment", "Service", "HorizontalPodAutoscaler")} | {
        ("ConfigMap", config) for config in K8S_APPS.values()}
    for doc in docs.values():
        kv.validate(doc, kv.latest_version(), strict=True)  # raises ValidationError naming the bad field


def test_k8s_schema_check_catches_a_broken_manifest():
    broken = k8s_documents()[("Deployment", "sieve")]
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/readyz"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, kv.latest_version(), strict=True)


def k8s_settings(config: dict) -> Settings:
    unknown = [k for k in config if k.removeprefix("SIEVE_").lower() not in Settings.model_fields]
    assert not unknown, f"ConfigMap keys that are not settings: {unknown}"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in config.items():
            patch.setenv(name, value)
        return Settings()


@pytest.mark.parametrize("app", K8S_APPS)
def test_k8s_objects_reference_each_other_the_routes_and_the_settings(docker, app_port, app):
    from sieve.cli import build_parser

    docs = {kind: doc for (kind, name), doc in k8s_documents().items()
            if name == app or (kind, name) in {("ConfigMap", K8S_APPS[app]), ("PersistentVolumeClaim", "sieve-data")}}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert docs["Deployment"]["spec"]["selector"]["matchLabels"].items() <= \
        docs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[docs["Service"]["spec"]["ports"][0]["targetPort"]] == app_port
    routes = declared_routes()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in routes and ports[get["port"]] == app_port, probe
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    assert container["envFrom"][0]["configMapRef"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert build_parser().parse_args(container["command"][1:]).command == "serve"
    settings = k8s_settings(docs["ConfigMap"]["data"])
    assert settings.port == app_port and settings.host == "0.0.0.0"
    assert str(settings.index_dir).startswith(container["volumeMounts"][0]["mountPath"])


def test_k8s_front_calls_the_cross_encoder_deployment_on_a_gpu_node(app_port):
    """The front's SIEVE_CE_URL is the CE Service's name and port; the CE pods load their cross-encoder in-process on
    a GPU node (node selector + nvidia.com/gpu request); its HPA scales on a latency series the app exports."""
    from sieve.pipeline.remote_ce import endpoint_url

    docs = k8s_documents()
    front, ce = k8s_settings(docs[("ConfigMap", "sieve-config")]["data"]), k8s_settings(docs[("ConfigMap", "sieve-ce-config")]["data"])
    url = endpoint_url(front.ce_url, front.ce_shape)
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    service = docs[("Service", "sieve-ce")]["spec"]
    assert host == "sieve-ce" and int(port) == service["ports"][0]["port"] and url.endswith("/rerank")
    assert ce.ce_url is None and ce.cross_encoder_enabled and ce.device.startswith("cuda")
    pod = docs[("Deployment", "sieve-ce")]["spec"]["template"]["spec"]
    assert any(key.startswith("nvidia.com/gpu") for key in pod["nodeSelector"])
    resources = pod["containers"][0]["resources"]
    assert int(resources["requests"]["nvidia.com/gpu"]) >= 1 and resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]
    hpa = docs[("HorizontalPodAutoscaler", "sieve-ce")]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "sieve-ce"
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Pods"], "the CE scales on its latency, not on CPU"
    series = hpa["metadata"]["annotations"]["sieve.dev/latency-series"]
    name, endpoint = re.fullmatch(r'(\w+)\{endpoint="([^"]+)"\}', series).groups()
    assert name in (ROOT / "sieve" / "service" / "metrics.py").read_text() and endpoint in declared_routes()
    assert f'seriesQuery: \'{name}_bucket{{endpoint="{endpoint}"}}\'' in (K8S / "ce.yaml").read_text()
