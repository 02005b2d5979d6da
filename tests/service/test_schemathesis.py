"""Schemathesis against the OpenAPI schema, over real HTTP (uvicorn in a thread, with the production protocol: httptools)
with tiny random models in the real runtimes: no 5xx, every response matches the documented status codes, content
types and schemas, every error is a JSON body with the documented `code` (and `field` where the request is at
fault: every 400 and 422), and no 2xx for an input the schema forbids. Beyond schemathesis's own generation
(issue 34), property-based cases built from the same schema: each typed body field sent as a string or float
("2", "true", 2.0: no coercion), bodies json.loads cannot read (invalid UTF-8, deep nesting, over-long numbers,
cut-off JSON), and headers past the limit, arriving in one read or many, to every route."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import schemathesis  # the [test] extra: imported, never skipped
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (content_type_conformance, negative_data_rejection, not_a_server_error,
                                 response_headers_conformance, response_schema_conformance, status_code_conformance)

from sieve.index import SearchIndex, build_index, read_beir_corpus
from sieve.models.cmc_checkpoint import untrained_cmc
from sieve.pipeline.searcher import Searcher
from sieve.service.app import create_app
from sieve.service.components import Components
from sieve.service.config import Settings
from sieve.service.connections import bounded_protocol
from sieve.service.runtime import searcher_options
from tests.conftest import DEMO_CORPUS
from tests.fakes import packaged_tokenizer, tiny_biencoder, tiny_cross_encoder
from tests.server import free_port

@schemathesis.check
def errors_have_code_and_field(ctx, response, case) -> None:
    """Every error is `{"error": {"code", "message", ...}}` as docs/api.md says, and a 400 or 422 (the request at
    fault) names the `field` to change."""
    if response.status_code < 400:
        return None
    body = error_of(response.status_code, response.headers.get("content-type"), response.content)
    if response.status_code in (400, 422):
        assert body.get("field"), f"{response.status_code} without a field: {body}"
    return None


def error_of(status: int, content_type, content: bytes) -> dict:
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    assert content_type and "json" in content_type, f"{status} answered {content_type}: {content[:200]!r}"
    body = json.loads(content)
    assert set(body) == {"error"} and body["error"].get("code") and body["error"].get("message"), body
    return body["error"]


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance, errors_have_code_and_field]
# Negative mode also demands a 4xx for every body, path or query the schema forbids: a 200 there is a defect.
# 413 is a rejection too (a generated body over SIEVE_MAX_BODY_BYTES); 5xx is left to not_a_server_error.
NEGATIVE_CHECKS = [*CHECKS, negative_data_rejection]
REJECTIONS = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory):
    tokenizer = packaged_tokenizer()
    biencoder, cross_encoder = tiny_biencoder(tokenizer), tiny_cross_encoder(tokenizer)
    index_dir = tmp_path_factory.mktemp("fake-index")
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, index_dir, progress=False)
    app_settings = Settings(index_dir=index_dir, model_name="tiny-bert", rerank_max_documents=50,
                            documents_max_batch=20, max_retrieve_k=100, max_top_k=100, write_batch_wait_ms=0)

    def loader(s: Settings) -> Components:
        index = SearchIndex.load(index_dir)
        cmc = untrained_cmc(biencoder, share_query_tower=True)
        return Components(Searcher(biencoder, index, cmc, cross_encoder, **searcher_options(s)), "cpu")

    app = create_app(app_settings, loader=loader)
    rejected = app.state.metrics.rejected
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                                           http=bounded_protocol(10, lambda reason: rejected.labels(reason=reason).inc()),
                                           h11_max_incomplete_event_size=app_settings.max_header_bytes))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the in-process server did not start"
    yield f"http://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(30)


OPERATION_EXAMPLES = 30  # per operation and mode: ~400 requests in all


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_api_conforms_to_its_schema(fake_server, mode):
    """Every operation of /openapi.json with generated valid bodies (positive) and invalid ones (negative).
    Hypothesis is driven by hand here: schemathesis.pytest.from_fixture does not run on this pytest."""
    from schemathesis import GenerationMode

    config = schemathesis.config.SchemathesisConfig.from_dict(
        {"checks": {"negative_data_rejection": {"expected-statuses": REJECTIONS}}})
    schema = schemathesis.openapi.from_url(f"{fake_server}/openapi.json", config=config)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /search", "POST /rerank", "POST /documents", "DELETE /documents/{doc_id}", "GET /documents/{doc_id}",
        "POST /admin/index/reload", "GET /healthz", "GET /readyz", "GET /metrics"}
    for operation in operations:
        if mode == "negative" and not (len(operation.body) or len(operation.path_parameters) or len(operation.query)):
            continue  # nothing to make invalid
        @given(case=operation.as_strategy(generation_mode=GenerationMode(mode)))
        @settings(max_examples=OPERATION_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            case.call_and_validate(checks=NEGATIVE_CHECKS if mode == "negative" else CHECKS)

        check()


# -- issue 34: property-based cases the schema's own generators rarely reach --------------------------------------
BODY_EXAMPLES = 12  # per operation and property below: ~200 requests in all


def body_operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [op for op in (r.ok() for r in schema.get_all_operations()) if len(op.body)]


def body_schema(operation) -> dict:
    """The request body's JSON schema, its top-level $ref resolved against the OpenAPI document."""
    document = operation.schema.raw_schema
    ref = operation.definition.raw["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return document["components"]["schemas"][ref.rsplit("/", 1)[-1]]


def scalar_types(prop: dict) -> set[str]:
    return {s.get("type") for s in [prop, *prop.get("anyOf", [])] if s.get("type")} - {"null"}


WRONG = {"integer": st.sampled_from(["2", "10", "2.0", 2.5, 2.0, True]), "boolean": st.sampled_from(["true", "yes", 1, 0]),
         "string": st.sampled_from([7, 2.5, True])}


@given(data=st.data())
@settings(max_examples=BODY_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def wrong_type_property(data, url, operation, typed):
    """A valid body with one scalar field replaced by a value of another JSON type: 422 naming that field."""
    from schemathesis import GenerationMode

    case = data.draw(operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    name = data.draw(st.sampled_from(sorted(typed)))
    body = {**case.body, name: data.draw(WRONG[typed[name]])}
    reply = httpx.post(f"{url}{operation.path}", json=body, timeout=60)
    assert reply.status_code == 422, (operation.path, body, reply.status_code, reply.text[:300])
    error = error_of(422, reply.headers.get("content-type"), reply.content)
    assert error["code"] == "validation_error", f"{name}={body[name]!r} was not refused by the schema: {error}"
    assert error["field"] and any(d["field"] == name for d in error["details"]), (body, error)


def test_wrong_json_types_are_refused_naming_the_field(fake_server):
    fuzzed = []
    for operation in body_operations(fake_server):
        props = body_schema(operation)["properties"]
        typed = {n: next(iter(t)) for n, p in props.items() if len(t := scalar_types(p)) == 1 and next(iter(t)) in WRONG}
        if typed:  # POST /documents has only its list
            wrong_type_property(url=fake_server, operation=operation, typed=typed)
            fuzzed.append(operation.path)
    assert {"/search", "/rerank", "/v2/rerank"} <= set(fuzzed), fuzzed


def unreadable(body: bytes):
    """Bytes json.loads cannot read, made from a valid body or from nothing."""
    return st.one_of(
        st.integers(1, max(1, len(body) - 1)).map(lambda cut: body[:cut]),  # cut off
        st.integers(0, len(body)).map(lambda at: body[:at] + b"\xff\xfe\xc3" + body[at:]),  # not UTF-8
        st.integers(2_000, 100_000).map(lambda n: b"[" * n + b"]" * n),  # past the parser's recursion limit
        st.integers(4_301, 20_000).map(lambda n: b'{"top_k": ' + b"7" * n + b"}"),  # past Python's digit limit
    )


@given(data=st.data())
@settings(max_examples=BODY_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def unreadable_body_property(data, url, operation):
    from schemathesis import GenerationMode

    case = data.draw(operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    raw = data.draw(unreadable(json.dumps(case.body).encode()))
    reply = httpx.post(f"{url}{operation.path}", content=raw, headers={"content-type": "application/json"}, timeout=60)
    error = error_of(reply.status_code, reply.headers.get("content-type"), reply.content)
    assert (reply.status_code, error["code"], error["field"]) == (400, "malformed_json", "body"), (raw[:100], error)


def test_bodies_json_cannot_read_are_malformed_json(fake_server):
    for operation in body_operations(fake_server):
        unreadable_body_property(url=fake_server, operation=operation)


def send_in_pieces(port: int, request: bytes, piece: int) -> bytes:
    """Sends `request` a piece at a time (each its own read on the server) until the server answers; the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for start in range(0, len(request), piece):
            try:
                sock.sendall(request[start:start + piece])
            except (BrokenPipeError, ConnectionResetError):
                break  # answered and closed while the headers were still arriving
            time.sleep(0.002)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@given(path=st.sampled_from(["/search", "/rerank", "/v2/rerank", "/documents", "/documents/x", "/readyz", "/nowhere"]),
       kilobytes=st.integers(65, 300), piece_kb=st.integers(1, 300), method=st.sampled_from(["GET", "POST"]))
@settings(max_examples=20, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
def oversized_headers_property(port, sent, path, kilobytes, piece_kb, method):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode() + b"".join(
        f"x-pad-{i}: {'x' * 1010}\r\n".encode() for i in range(kilobytes))
    answer = send_in_pieces(port, head + b"\r\n", piece_kb * 1024)
    status, _, body = answer.partition(b"\r\n\r\n")
    content_type = next((line.split(b":", 1)[1].strip().decode() for line in status.split(b"\r\n")
                         if line.lower().startswith(b"content-type:")), None)
    assert status.startswith(b"HTTP/1.1 400"), answer[:300]
    assert error_of(400, content_type, body)["code"] == "headers_too_large"
    sent.append(1)


def test_headers_past_the_limit_are_json_and_counted_however_they_arrive(fake_server):
    def rejected() -> float:
        lines = httpx.get(f"{fake_server}/metrics").text.splitlines()
        return sum(float(l.rsplit(" ", 1)[1]) for l in lines if l.startswith('sieve_rejected_total{reason="headers_too_large"'))

    before, sent = rejected(), []
    oversized_headers_property(port=int(fake_server.rsplit(":", 1)[1]), sent=sent)
    assert rejected() == before + len(sent)
