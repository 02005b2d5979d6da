"""/readyz reports each stage's number format: what this CPU offers with SIEVE_PRECISION=auto (the service's
default; the cross-encoder compiled by OpenVINO where the CPU has native bf16), fp32 everywhere with SIEVE_PRECISION=fp32
(what the rest of the suite runs); the lowered server answers /search and /rerank."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from sieve.index import SearchIndex
from sieve.models.precision import MIN_SPEARMAN, int8_kernels, native_bf16
from sieve.service.config import Settings
from sieve.service.runtime import flat_device
from tests.server import Server


def expected(int8: bool = True) -> str:
    return "bf16" if native_bf16() else "int8" if int8 and int8_kernels() else "fp32"


@pytest.fixture(scope="module")
def auto_index(demo_index, tmp_path_factory):
    """A copy of the demo index: a test writes to it."""
    copy = tmp_path_factory.mktemp("auto-precision") / "index"
    shutil.copytree(demo_index, copy)
    return copy


@pytest.fixture(scope="module")
def auto_server(auto_index, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(auto_index), "SIEVE_PRECISION": "auto", "SIEVE_CMC_PATH": "shipped:cmc",
                  "SIEVE_CROSS_ENCODER_ENABLED": "true"},  # the shipped (gated) cross-encoder
                 tmp_path_factory.mktemp("logs") / "auto-server.log")
    yield srv
    srv.stop()


def test_auto_reports_what_this_cpu_runs_and_serves(auto_server):
    with auto_server.client() as client:
        precision = client.get("/readyz").json()["precision"]
        assert precision["cmc"]["dtype"] == expected(), precision
        assert precision["bi_encoder_query"]["dtype"] == expected(int8=False), precision
        assert precision["bi_encoder_documents"]["dtype"] == expected(int8=False), precision  # live writes
        # the cross-encoder: compiled by OpenVINO where the CPU has native bf16 (SIEVE_CE_RUNTIME=auto), else torch
        assert (precision["cross_encoder"]["dtype"], precision["cross_encoder"]["runtime"]) == (
            ("bf16", "openvino") if native_bf16() else ("fp32", "torch")), precision
        on_torch = flat_device(Settings(), torch.device("cpu")) == "cpu"  # torch's flat search on this CPU kind
        assert precision["vector_search"]["dtype"] == ("bf16" if on_torch and native_bf16() else "fp32"), precision
        for stage in precision.values():
            assert stage["spearman"] is None or stage["spearman"] >= MIN_SPEARMAN, precision
        body = client.post("/search", json={"query": "how do stars die", "rerank": "cmc", "top_k": 5}).json()
        texts = ["Red giant stars swell when hydrogen runs out.", "Bread rises because yeast makes gas."] * 3
        reranked = client.post("/rerank", json={"query": "what happens when a star runs out of hydrogen",
                                                "documents": texts, "top_n": 6, "model": "ce"},
                               headers={"Cache-Control": "no-cache"})
    scores = [hit["scores"]["cmc"] for hit in body["results"]]
    assert len(scores) == 5 and scores == sorted(scores, reverse=True)
    assert reranked.status_code == 200, reranked.text
    assert [r["index"] % 2 for r in reranked.json()["results"]] == [0, 0, 0, 1, 1, 1]


def test_a_live_write_is_encoded_by_the_lowered_document_tower(auto_server, auto_index, biencoder):
    doc = {"id": "kombucha-1", "title": "Kombucha", "text": "Kombucha is tea fermented by a culture of yeast and bacteria."}
    with auto_server.client() as client:
        documents = client.get("/readyz").json()["precision"]["bi_encoder_documents"]
        assert client.post("/documents", json={"documents": [doc]}).status_code == 200
        found = client.post("/search", json={"query": "tea fermented by yeast and bacteria", "top_k": 1},
                            headers={"Cache-Control": "no-cache"}).json()["results"]
    assert found[0]["id"] == doc["id"]
    with SearchIndex.load(auto_index) as index:
        stored = index.embeddings(index.rows_for_ids([doc["id"]]))[0]
    fp32 = biencoder.encode_documents([f"{doc['title']} {doc['text']}"], progress=False)[0]
    assert float(stored @ fp32) / float(np.linalg.norm(stored) * np.linalg.norm(fp32)) > 0.999
    if documents["dtype"] == "fp32":
        np.testing.assert_allclose(stored, fp32, atol=1e-5)
    else:  # written by the lowered tower, not by an fp32 one
        assert documents["dtype"] == "bf16" and not np.allclose(stored, fp32, atol=1e-5), documents


def test_fp32_setting_runs_every_stage_in_fp32(client):
    precision = client.get("/readyz").json()["precision"]
    # this server loads no cross-encoder
    assert set(precision) == {"bi_encoder_query", "bi_encoder_documents", "cmc", "vector_search"}
    assert precision.pop("vector_search")["dtype"] == "fp32"  # the reason: the setting, or FAISS's search on this CPU
    fp32 = {"dtype": "fp32", "reason": "SIEVE_PRECISION=fp32", "spearman": None, "runtime": "torch"}
    assert all(p == fp32 for p in precision.values())
