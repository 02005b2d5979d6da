"""/readyz reports each stage's number format: what this CPU offers with SIEVE_PRECISION=auto (the service's
default), fp32 everywhere with SIEVE_PRECISION=fp32 (what the rest of the suite runs); the lowered server answers."""
from __future__ import annotations

import pytest

from sieve.models.precision import MIN_SPEARMAN, int8_kernels, native_bf16
from tests.server import Server


def expected(int8: bool = True) -> str:
    return "bf16" if native_bf16() else "int8" if int8 and int8_kernels() else "fp32"


@pytest.fixture(scope="module")
def auto_server(demo_index, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_PRECISION": "auto", "SIEVE_CMC_PATH": "shipped:cmc"},
                 tmp_path_factory.mktemp("logs") / "auto-server.log")
    yield srv
    srv.stop()


def test_auto_reports_what_this_cpu_runs_and_serves(auto_server):
    with auto_server.client() as client:
        precision = client.get("/readyz").json()["precision"]
        assert precision["cmc"]["dtype"] == expected(), precision
        assert precision["bi_encoder_query"]["dtype"] == expected(int8=False), precision
        for stage in precision.values():
            assert stage["spearman"] is None or stage["spearman"] >= MIN_SPEARMAN, precision
        body = client.post("/search", json={"query": "how do stars die", "rerank": "cmc", "top_k": 5}).json()
    scores = [hit["scores"]["cmc"] for hit in body["results"]]
    assert len(scores) == 5 and scores == sorted(scores, reverse=True)


def test_fp32_setting_runs_every_stage_in_fp32(client):
    precision = client.get("/readyz").json()["precision"]
    assert set(precision) == {"bi_encoder_query", "cmc"}  # this server loads no cross-encoder
    assert all(p == {"dtype": "fp32", "reason": "SIEVE_PRECISION=fp32", "spearman": None} for p in precision.values())
