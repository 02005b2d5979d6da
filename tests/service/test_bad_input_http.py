"""Every bad request gets a 4xx JSON body that says what is wrong and what is allowed; never a 500."""
from __future__ import annotations

import pytest


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["message"]
    assert "Traceback" not in response.text
    return body["error"]


@pytest.mark.parametrize("body, field", [
    ({"query": ""}, "query"),
    ({"query": "ok", "top_k": 0}, "top_k"),
    ({"query": "ok", "top_k": -3}, "top_k"),
    ({"query": "ok", "retrieve_k": 0}, "retrieve_k"),
    ({"query": "ok", "rerank": "no such stage!"}, "rerank"),  # not a stage name at all
    ({"query": "ok", "colour": "blue"}, "colour"),
    ({"query": 12}, "query"),
    ({}, "query"),
])
def test_invalid_search_fields(client, body, field):
    error = error_of(client.post("/search", json=body), 422)
    assert error["code"] == "validation_error"
    assert any(d["field"] == field for d in error["details"]), error


@pytest.mark.parametrize("body, field", [
    ({"query": "ok", "rerank": "bm25"}, "rerank"),  # a registered stage, but a retriever
    ({"query": "ok", "retriever": "cmc"}, "retriever"),
    ({"query": "ok", "retriever": "colbert"}, "retriever"),
    ({"query": "ok", "cross_encoder": True, "ce_model": "cmc"}, "ce_model"),
])
def test_stage_names_outside_the_registry_role(client, body, field):
    """Stage names are checked against the stage registry: 422 naming the field and the stages it may name."""
    error = error_of(client.post("/search", json=body), 422)
    assert error["code"] == "invalid_request" and error["field"] == field
    allowed = error["allowed"].split(" | ")
    assert body[field] not in allowed
    assert {"retriever": {"be", "bm25", "hybrid"}, "rerank": {"cmc", "none"}, "ce_model": {"ce"}}[field] <= set(allowed)


def test_whitespace_query(client):
    error = error_of(client.post("/search", json={"query": "   \n\t "}), 422)
    assert error["field"] == "query" and "empty" in error["message"]


def test_top_k_above_retrieve_k(client):
    error = error_of(client.post("/search", json={"query": "ok", "top_k": 50, "retrieve_k": 10}), 422)
    assert "retrieve_k" in error["message"]


def test_above_server_limits(client):
    error = error_of(client.post("/search", json={"query": "ok", "retrieve_k": 10**6, "top_k": 5}), 422)
    assert error["field"] == "retrieve_k" and "SIEVE_MAX_RETRIEVE_K" in error["allowed"]


def test_malformed_json(client):
    error = error_of(client.post("/search", content=b'{"query": "x",', headers={"content-type": "application/json"}), 400)
    assert error["code"] == "malformed_json"


def test_cross_encoder_not_configured(client):
    error = error_of(client.post("/search", json={"query": "ok", "cross_encoder": True}), 400)
    assert error["code"] == "stage_unavailable" and "SIEVE_CROSS_ENCODER_PATH" in error["allowed"]
    error = error_of(client.post("/rerank", json={"query": "ok", "documents": ["a"], "model": "ce"}), 400)
    assert error["code"] == "stage_unavailable"


def test_too_many_rerank_documents(client):
    error = error_of(client.post("/rerank", json={"query": "ok", "documents": ["d"] * 51}), 422)
    assert error["field"] == "documents" and "50" in error["allowed"]


def test_unknown_ids_in_rerank(client):
    error = error_of(client.post("/rerank", json={"query": "ok", "documents": [{"id": "no-such-doc"}]}), 422)
    assert error["code"] == "unknown_document_ids" and "no-such-doc" in error["message"]


def test_rerank_item_needs_id_or_text(client):
    error_of(client.post("/rerank", json={"query": "ok", "documents": [{}]}), 422)
    error_of(client.post("/rerank", json={"query": "ok", "documents": []}), 422)


def test_unknown_route_and_method(client):
    assert error_of(client.get("/nope"), 404)["code"] == "not_found"
    assert error_of(client.get("/search"), 405)["code"] == "method_not_allowed"


def test_long_query_truncated_by_default(client):
    out = client.post("/search", json={"query": "protein folding " * 200, "top_k": 3})
    assert out.status_code == 200
    assert any("truncated" in w for w in out.json()["warnings"])


def test_long_query_rejected_when_configured(ce_server):
    with ce_server.client() as client:
        error = error_of(client.post("/search", json={"query": "protein folding " * 200}), 413)
        assert error["code"] == "query_too_long"


def test_bad_requests_are_counted_and_server_still_answers(client):
    client.post("/search", json={"query": ""})
    assert 'sieve_requests_total{endpoint="/search",status="422"}' in client.get("/metrics").text
    assert client.post("/search", json={"query": "fine"}).status_code == 200
