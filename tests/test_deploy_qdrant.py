"""Deploy files of the Qdrant backend agree with the code: the Kubernetes manifests validate against the official
schemas, their settings load, the build Job's command parses, the collection is spread over more than one shard and
replica of a multi-node cluster (the Helm values), and the compose profile wires Sieve to the Qdrant service."""
from __future__ import annotations

import kubernetes_validate as kv
import pytest
import yaml

from sieve.service.config import Settings
from tests.test_deploy_files import COMPOSE, ROOT, declared_routes, k8s_settings

QDRANT_K8S = ROOT / "deploy" / "k8s" / "qdrant"


def documents() -> dict[tuple[str, str], dict]:
    docs = {}
    for doc in yaml.safe_load_all((QDRANT_K8S / "sieve-qdrant.yaml").read_text()):
        docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def test_manifests_validate_against_the_kubernetes_schemas():
    docs = documents()
    assert {("ConfigMap", "sieve-qdrant-config"), ("Deployment", "sieve-qdrant"), ("Service", "sieve-qdrant"),
            ("Job", "sieve-qdrant-build"), ("PersistentVolumeClaim", "sieve-corpus")} == set(docs)
    for doc in docs.values():
        kv.validate(doc, kv.latest_version(), strict=True)


def test_sieve_runs_against_a_sharded_replicated_qdrant_cluster():
    from sieve.cli import build_parser

    docs = documents()
    settings = k8s_settings(docs[("ConfigMap", "sieve-qdrant-config")]["data"])
    values = yaml.safe_load((QDRANT_K8S / "qdrant-values.yaml").read_text())
    assert settings.index_backend == "qdrant" and settings.host == "0.0.0.0"
    assert settings.qdrant_url == "http://qdrant:6333"  # the Service of Helm release "qdrant"
    assert values["config"]["cluster"]["enabled"] and values["replicaCount"] >= 3
    assert settings.qdrant_shards > 1 and 1 < settings.qdrant_replicas <= values["replicaCount"]
    assert settings.qdrant_write_consistency <= settings.qdrant_replicas
    job = docs[("Job", "sieve-qdrant-build")]["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(job["command"][1:])
    assert (args.command, args.index_command, args.backend) == ("index", "build", "qdrant")
    assert job["envFrom"][0]["configMapRef"]["name"] == "sieve-qdrant-config"
    pod = docs[("Deployment", "sieve-qdrant")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert build_parser().parse_args(container["command"][1:]).command == "serve"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe")} <= declared_routes()
    assert docs[("Deployment", "sieve-qdrant")]["spec"]["replicas"] > 1


def test_compose_profile_points_sieve_at_the_qdrant_service():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    sieve, qdrant = services["sieve-qdrant"], services["qdrant"]
    assert sieve["profiles"] == qdrant["profiles"] == ["qdrant"]
    assert qdrant["image"].startswith("qdrant/qdrant:")
    env = {k: str(v) for k, v in sieve["environment"].items()}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        settings = Settings()
    host = settings.qdrant_url.split("//", 1)[1].split(":")[0]
    assert settings.index_backend == "qdrant" and host == "qdrant" and host in services
    assert sieve["depends_on"]["qdrant"]["condition"] == "service_healthy"
