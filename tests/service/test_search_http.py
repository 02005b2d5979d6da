"""/search, /readyz, /healthz, /metrics and /docs through real HTTP against a real uvicorn process."""
from __future__ import annotations

import math

import numpy as np

from sieve.index import read_beir_corpus
from tests.conftest import DEMO_CORPUS


def search(client, **body):
    response = client.post("/search", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_health_and_ready(client, demo_index):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["index_size"] == len(read_beir_corpus(DEMO_CORPUS))
    assert ready["models"]["bi_encoder"] == "all-MiniLM-L6-v2" and ready["models"]["cross_encoder"] is None
    assert ready["index_version"] == 1


def test_search_finds_the_topic_and_reports_every_stage(client):
    out = search(client, query="Which volcanoes erupt lava explosively?", top_k=5, return_documents=True)
    assert [r["rank"] for r in out["results"]] == [1, 2, 3, 4, 5]
    top = out["results"][0]
    assert "volcan" in (top["document"]["title"] + top["document"]["text"]).lower()
    assert out["stages"] == ["retrieve", "cmc"]
    for key in ("be_encode", "mips", "cmc", "total"):
        assert out["timings_ms"][key] > 0
    assert out["timings_ms"].get("cmc_encode", 1) > 0  # absent: the CMC query tower is the bi-encoder (one encoding)
    # only the stages that ran are listed: no keys (not even nulls) for the cross-encoder or the research stages
    assert not {"ce", "mix", "ce_late", "anncur"} & set(out["timings_ms"])
    assert set(top["scores"]) == {"retrieve", "be", "bm25", "cmc"}  # hybrid (the default here) keeps both scores
    scores = [r["score"] for r in out["results"]]
    assert scores == sorted(scores, reverse=True)


def test_untrained_cmc_keeps_the_biencoder_order(client):
    with_cmc = search(client, query="jazz improvisation", top_k=10, rerank="cmc", retriever="be")
    without = search(client, query="jazz improvisation", top_k=10, rerank="none", retriever="be")
    assert [r["id"] for r in with_cmc["results"]] == [r["id"] for r in without["results"]]
    assert "cmc" not in without["results"][0]["scores"]  # CMC did not run
    for r in with_cmc["results"]:
        assert math.isclose(r["scores"]["cmc"], r["scores"]["retrieve"], abs_tol=1e-4)


def test_search_matches_exact_inner_product(client, biencoder, demo_index):
    docs = read_beir_corpus(DEMO_CORPUS)
    vectors = biencoder.encode_documents([d.full_text for d in docs], progress=False)
    query = biencoder.encode_queries(["cooking pasta sauce"])[0].numpy()
    expected = [docs[i].id for i in np.argsort(-(vectors @ query))[:5]]
    got = search(client, query="cooking pasta sauce", top_k=5, rerank="none")
    assert [r["id"] for r in got["results"]] == expected


def test_retrieve_k_above_index_size_is_clamped_and_said(client):
    out = search(client, query="bicycle gears", top_k=3, retrieve_k=5000)
    assert any("clamped" in w for w in out["warnings"])
    assert len(out["results"]) == 3


def stage_count(metrics: str, stage: str) -> float:
    prefix = f'sieve_stage_latency_seconds_count{{stage="{stage}"}} '
    return sum(float(line[len(prefix):]) for line in metrics.splitlines() if line.startswith(prefix))


def test_metrics_expose_stage_latency_requests_candidates_and_index_size(client):
    before = client.get("/metrics").text
    search(client, query="metrics probe: database transactions", top_k=3)  # a query no other test sends: no cache hit
    text = client.get("/metrics").text
    for stage in ("be_encode", "mips", "bm25", "fuse", "cmc", "total"):  # the default retriever is hybrid
        assert f'sieve_stage_latency_seconds_count{{stage="{stage}"}}' in text
        assert stage_count(text, stage) == stage_count(before, stage) + 1
    # the untrained CMC's query tower is the bi-encoder itself: a search encodes the query once, so it adds no
    # cmc_encode observation (a /rerank with model cmc, which this session's server may have served, does)
    assert stage_count(text, "cmc_encode") == stage_count(before, "cmc_encode")
    assert 'sieve_requests_total{endpoint="/search",status="200"}' in text
    assert 'sieve_stage_candidates_bucket{le="64.0",stage="retrieve"}' in text
    size = [line for line in text.splitlines() if line.startswith("sieve_index_size ")]
    assert size and float(size[0].split()[1]) == len(read_beir_corpus(DEMO_CORPUS))


def test_openapi_describes_every_field(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"SearchRequest", "SearchResponse", "RerankRequest", "RerankResponse", "Ready"} <= set(schemas)
    undocumented = [f"{name}.{field}" for name, schema in schemas.items() if name not in ("HTTPValidationError", "ValidationError")
                    for field, spec in schema.get("properties", {}).items() if not spec.get("description")]
    assert not undocumented, f"fields without a description: {undocumented}"
    assert client.get("/docs").status_code == 200


def test_the_default_retriever_is_hybrid_and_each_first_stage_is_selectable(client):
    """The demo index has a BM25 part: unset = hybrid (both first-stage scores on every hit); be and bm25 on ask."""
    query = "metamorphic rock under heat and pressure"
    hybrid = search(client, query=query, top_k=5, rerank="none")
    assert hybrid["stages"] == ["retrieve"] and all(hybrid["timings_ms"][k] > 0 for k in ("mips", "bm25", "fuse"))
    for hit in hybrid["results"]:
        assert hit["scores"].get("be") is not None and hit["scores"].get("bm25") is not None
    assert hybrid["results"][0]["score"] == hybrid["results"][0]["scores"]["retrieve"] <= 2 / 61  # an RRF score
    be = search(client, query=query, top_k=5, rerank="none", retriever="be")
    assert be["timings_ms"].get("bm25") is None and be["results"][0]["scores"].get("bm25") is None
    bm25 = search(client, query="lava volcano eruption", top_k=5, rerank="none", retriever="bm25", return_documents=True)
    assert bm25["timings_ms"].get("be_encode") is None and bm25["timings_ms"]["bm25"] > 0
    assert "volcan" in (bm25["results"][0]["document"]["title"] + bm25["results"][0]["document"]["text"]).lower()
    nothing = search(client, query="zzyzx qwxq", top_k=5, rerank="none", retriever="bm25")
    assert nothing["results"] == [] and any("BM25 found nothing" in w for w in nothing["warnings"])
