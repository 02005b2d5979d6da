"""Malformed, huge and hostile inputs: every one gets a clear 4xx (or an ordinary answer), never a 5xx, and the
server keeps answering."""
from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from tests.service.conftest import auth

UNICODE_QUERIES = ["火山は どのように 噴火 する のか", "وكيف تثور البراكين", "🌋🔥 lava 🌋", "e\u0301ruption volcanique",
                   "zero\u200bwidth\u200djoiner", "\U0001F600" * 500, "x\u0000y\u0007z\u001b[31m", "\ud7ff\ue000\uffff"]


def assert_client_error(response, status: int | None = None) -> dict:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    assert status is None or response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    assert body["error"]["code"] and body["error"]["message"] and "Traceback" not in response.text
    return body["error"]


@pytest.mark.parametrize("query", UNICODE_QUERIES)
def test_unicode_and_control_characters_are_searched_or_refused_clearly(client, query):
    response = client.post("/search", json={"query": query, "top_k": 3})
    assert response.status_code in (200, 422), response.text
    if response.status_code == 200:
        assert len(response.json()["results"]) == 3


def test_a_one_megabyte_query(client):
    error = assert_client_error(client.post("/search", json={"query": "lava " * 200_000}), 422)
    assert error["details"][0]["field"] == "query"


def test_ten_thousand_documents(client):
    error = assert_client_error(client.post("/rerank", json={"query": "q", "documents": ["d"] * 10_000}), 422)
    assert error["field"] == "documents"
    docs = [{"id": f"id-{i}", "text": "t"} for i in range(10_000)]
    assert assert_client_error(client.post("/documents", json={"documents": docs}), 422)["field"] == "documents"


@pytest.mark.parametrize("field, value", [
    ("top_k", -1), ("top_k", 10**30), ("top_k", 1e308), ("top_k", 2.5), ("top_k", "ten"), ("top_k", None),
    ("retrieve_k", -(10**12)), ("cmc_k", 0), ("timeout_ms", 0), ("timeout_ms", -5), ("timeout_ms", 10**13),
    ("return_documents", "maybe"), ("query", ["a", "b"]), ("query", {"$ne": 1}),
])
def test_absurd_numbers_and_types(client, field, value):
    assert_client_error(client.post("/search", json={"query": "ok", field: value}), 422)


@pytest.mark.parametrize("raw, content_type", [
    (b"\xff\xfe\xfd not utf-8", "application/json"),
    (b"[" * 100_000 + b"]" * 100_000, "application/json"),  # nesting deeper than any parser's recursion limit
    (b'{"query": "a", "top_k": ' + b"9" * 5000 + b"}", "application/json"),  # past Python's int-digits limit
    (b'{"query": NaN}', "application/json"),
    (b'"just a string"', "application/json"),
    (b"query=volcano", "application/x-www-form-urlencoded"),
    (b"", "application/json"),
])
def test_malformed_bodies(client, raw, content_type):
    assert_client_error(client.post("/search", content=raw, headers={"content-type": content_type}))


LONE_SURROGATE = "\\ud800"  # as JSON escapes it: the raw body carries the six characters \ud800


@pytest.mark.parametrize("path, body", [
    ("/search", '{"query": "lava %s flow"}'),
    ("/rerank", '{"query": "q %s", "documents": ["fine text"]}'),
    ("/rerank", '{"query": "volcano", "documents": ["fine text", "bad %s text"]}'),
    ("/rerank", '{"query": "volcano", "documents": [{"text": "bad %s text"}]}'),
    ("/rerank", '{"query": "volcano", "documents": [{"id": "astro-1%s"}]}'),
])
def test_lone_surrogates_are_refused_with_422_everywhere_text_is_read(client, path, body):
    raw = (body % LONE_SURROGATE).encode()
    error = assert_client_error(client.post(path, content=raw, headers={"content-type": "application/json"}), 422)
    assert error["code"] == "validation_error" and "surrogate" in error["message"], error


@pytest.mark.parametrize("doc", [{"id": "bad\u0000id", "text": "t"}, {"id": "tab\tid", "text": "t"},
                                 {"id": "esc\u001b[31m", "text": "t"}, {"id": "c1\u0085", "text": "t"},
                                 {"id": "fine-id", "title": "x", "text": "bad \ud800 text"}])
def test_documents_with_control_characters_in_ids_or_surrogates_are_refused(guarded_server, fresh_key, doc):
    key = auth(fresh_key())
    with guarded_server.client() as client:
        body = json.dumps({"documents": [doc]})  # ensure_ascii: NUL and surrogates go as \u escapes
        error = assert_client_error(client.post("/documents", content=body, headers={**key, "content-type":
                                                                                      "application/json"}), 422)
        assert error["details"][0]["field"].startswith("documents.0."), error
        assert client.get("/documents/" + quote(doc["id"], safe=""), headers=key).status_code in (404, 422)


def test_hostile_paths_and_ids(client):
    assert assert_client_error(client.get("/documents/..%2F..%2Fetc%2Fpasswd"), 404)["code"] == "not_found"
    assert client.get("/documents/" + "a" * 600).status_code == 422
    assert_client_error(client.post("/search", json={"query": "ok", "index_dir": "/etc"}), 422)  # never from requests


def test_the_server_is_unharmed(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    out = client.post("/search", json={"query": "how do volcanoes erupt", "top_k": 2})
    assert out.status_code == 200 and len(out.json()["results"]) == 2
    assert 'status="500"' not in client.get("/metrics").text
