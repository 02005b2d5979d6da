"""POST /v2/rerank driven by Cohere's own Python SDK (cohere.ClientV2) against a real running Sieve."""
from __future__ import annotations

import math

import cohere
import httpx
import pytest

from tests.server import Server
from tests.service.conftest import auth

TEXTS = ["The Roman legions built roads across the empire.",
         "A telescope collects light from distant galaxies.",
         "Knead the dough and let it rise before baking bread.",
         "Bread ovens in Rome baked loaves for the legions."]
KEYS = [f"cohere-key-{i:02d}-0123456789" for i in range(20)]
_unused = iter(KEYS)
MAX_DOCUMENTS = 6


@pytest.fixture(scope="module")
def keyed_server(demo_index, ce_checkpoint, tmp_path_factory):
    """Cross-encoder loaded, API keys required, a tight in-process rate limit (burst 4 per key, 1 refill / 10 s)."""
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_CROSS_ENCODER_PATH": str(ce_checkpoint),
                  "SIEVE_API_KEYS": ",".join(KEYS), "SIEVE_RATE_LIMIT_PER_S": "0.1", "SIEVE_RATE_LIMIT_BURST": "4",
                  "SIEVE_RERANK_MAX_DOCUMENTS": str(MAX_DOCUMENTS)},
                 tmp_path_factory.mktemp("logs") / "cohere-server.log")
    yield srv
    srv.stop()


def sdk(server, key: str | None = None) -> cohere.ClientV2:
    return cohere.ClientV2(base_url=server.url, api_key=key or next(_unused), timeout=120)


def sieve_rerank(server, key: str, **body) -> dict:
    with server.client() as client:
        out = client.post("/rerank", json=body, headers=auth(key))
    assert out.status_code == 200, out.text
    return out.json()


@pytest.mark.parametrize("model", ["ce", "cmc"])
def test_ranks_like_sieve_rerank_with_the_same_model(keyed_server, model):
    key = next(_unused)
    reply = sdk(keyed_server, key).rerank(model=model, query="how is bread baked", documents=TEXTS)
    expected = sieve_rerank(keyed_server, key, query="how is bread baked", documents=TEXTS, model=model)
    assert [r.index for r in reply.results] == [r["index"] for r in expected["results"]]
    assert sorted(r.index for r in reply.results) == [0, 1, 2, 3]
    scores = [r.relevance_score for r in reply.results]
    assert scores == sorted(scores, reverse=True)
    for got, want in zip(scores, (r["relevance_score"] for r in expected["results"])):
        assert math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-4)
    assert reply.id and reply.meta.api_version.version == "2" and reply.meta.billed_units.search_units == 1


def test_top_n_and_cohere_model_names_use_the_cross_encoder_when_loaded(keyed_server):
    key = next(_unused)
    top = sdk(keyed_server, key).rerank(model="rerank-v3.5", query="galaxies", documents=TEXTS, top_n=2)
    full = sieve_rerank(keyed_server, key, query="galaxies", documents=TEXTS, model="ce")
    assert len(top.results) == 2
    assert [r.index for r in top.results] == [r["index"] for r in full["results"][:2]]


def test_max_tokens_per_doc_cuts_each_document_to_its_first_words(keyed_server):
    key = next(_unused)
    cut = sdk(keyed_server, key).rerank(model="ce", query="bread", documents=TEXTS, max_tokens_per_doc=3)
    first_three = [" ".join(t.split()[:3]) for t in TEXTS]
    expected = sieve_rerank(keyed_server, key, query="bread", documents=first_three, model="ce")
    assert [r.index for r in cut.results] == [r["index"] for r in expected["results"]]
    for got, want in zip(cut.results, expected["results"]):
        assert math.isclose(got.relevance_score, want["relevance_score"], rel_tol=1e-4, abs_tol=1e-4)


def test_a_wrong_key_is_the_sdks_unauthorized_error(keyed_server):
    with pytest.raises(cohere.UnauthorizedError) as raised:
        sdk(keyed_server, "not-a-key").rerank(model="ce", query="bread", documents=TEXTS)
    assert raised.value.status_code == 401 and raised.value.body["error"]["code"] == "unauthorized"


def test_past_the_rate_limit_is_the_sdks_too_many_requests_error(keyed_server):
    client = sdk(keyed_server)
    with pytest.raises(cohere.TooManyRequestsError) as raised:
        for _ in range(10):  # a bucket of 4 refilled once every 10 s: the fifth or sixth call is refused
            # the SDK retries a 429 after Retry-After by itself (twice by default): no retries, so it surfaces
            client.rerank(model="cmc", query="bread", documents=TEXTS, request_options={"max_retries": 0})
    assert raised.value.status_code == 429 and raised.value.body["error"]["code"] == "rate_limited"


def test_too_many_documents_is_the_sdks_unprocessable_entity_error(keyed_server):
    with pytest.raises(cohere.UnprocessableEntityError) as raised:
        sdk(keyed_server).rerank(model="cmc", query="bread", documents=TEXTS * 2)
    error = raised.value.body["error"]
    assert error["field"] == "documents" and "SIEVE_RERANK_MAX_DOCUMENTS" in error["allowed"]
    assert len(TEXTS * 2) > MAX_DOCUMENTS


def test_an_unknown_model_is_refused_with_the_allowed_names(keyed_server):
    with pytest.raises(cohere.UnprocessableEntityError) as raised:
        sdk(keyed_server).rerank(model="gpt-4", query="bread", documents=TEXTS)
    error = raised.value.body["error"]
    assert error["field"] == "model" and {"ce", "cmc"} <= set(error["allowed"].split(" | "))


def test_cohere_model_names_fall_back_to_cmc_without_a_cross_encoder(server):
    """The session server loads no cross-encoder (and needs no key): rerank-* ranks like /rerank with cmc."""
    reply = sdk(server, "any").rerank(model="rerank-english-v3.0", query="stars and galaxies", documents=TEXTS)
    expected = httpx.post(f"{server.url}/rerank", json={"query": "stars and galaxies", "documents": TEXTS}).json()
    assert [r.index for r in reply.results] == [r["index"] for r in expected["results"]]
    assert reply.results[0].index == 1
