"""SIEVE_FAST_SEARCH: POST /search answered past FastAPI gives what FastAPI gives. The same requests (valid and
invalid bodies, content types, limits the handler checks, API keys, a rate limit) go to two apps over the same index
and tiny models, one with the fast path and one without: status, headers and bodies must be identical (request_id
and timings_ms aside), the metrics must count the same, and the fast path must have answered every valid body."""
from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from sieve.index import SearchIndex, build_index, read_beir_corpus
from sieve.models.cmc_checkpoint import untrained_cmc
from sieve.pipeline.searcher import Searcher
from sieve.service.app import create_app
from sieve.service.components import Components
from sieve.service.config import Settings
from sieve.service.fast_search import FastSearch
from sieve.service.protection import RateLimiter
from sieve.service.runtime import searcher_options
from sieve.service.schemas import CohereRerankRequest, RerankRequest, SearchRequest
from tests.conftest import DEMO_CORPUS
from tests.fakes import packaged_tokenizer, tiny_biencoder, tiny_cross_encoder

KEY = "fast-path-key-0123456789"
JSON = {"content-type": "application/json"}
BODIES = [
    # valid: answered by the fast path
    '{"query": "bread"}', '{"query": "bread", "top_k": 3}', '{"query": "bread", "top_k": 3, "return_documents": true}',
    '{"query": "bread", "rerank": "none", "top_k": 2}', '{"query": "volcanoes", "retriever": "bm25"}',
    '{"query": "volcanoes", "retriever": "be", "rerank": "cmc", "cmc_k": 4}', '{"query": "bread", "timeout_ms": 5000}',
    '{"query": "bread", "cross_encoder": true, "top_k": 4}', '{"query": "bread", "cross_encoder": false}',
    '{"query": "b\\u00e4ckerei \\u2603 \\ud83c\\udf5e"}', '  {"query": "bread"}  \n', '{"query": "a", "query": "bread"}',
    '{"query": "bread", "retrieve_k": 7, "top_k": 7}', '{"query": "bread", "timeout_ms": null, "rerank": null}',
    # valid JSON for the schema, refused by the handler (4xx from the same code either way)
    '{"query": "bread", "top_k": 1000}', '{"query": "bread", "retrieve_k": 100000}',
    '{"query": "bread", "top_k": 20, "retrieve_k": 10}', '{"query": "bread", "retriever": "nope"}',
    '{"query": "bread", "rerank": "nope"}', '{"query": "bread", "ce_model": "ce_late", "cross_encoder": true}',
    # invalid: FastAPI answers them
    '', 'not json', '{"query": 1}', '{"top_k": 2}', '{}', '[1, 2]', '"bread"', 'null',
    '{"query": "bread", "extra": 1}', '{"query": "bread", "top_k": "2"}', '{"query": "bread", "top_k": 2.0}',
    '{"query": "bread", "top_k": 0}', '{"query": "bread", "top_k": true}', '{"query": "bread", "timeout_ms": 0}',
    '{"query": "bread", "timeout_ms": 600001}', '{"query": "bread"', '{"query": "bread"} x', '{"query": ""}',
    '{"query": "\\ud800"}', '{"query": "bread", "timeout_ms": NaN}', '{"query": "bread", "top_k": 1e2}',
    '{"query": "bread", "top_k": ' + "9" * 5000 + "}", '{"query": "' + "a" * 10_001 + '"}',
    '{"query": "bread", "retriever": "a b"}', '{"query": "bread", "return_documents": "yes"}',
    "[" * 300 + "]" * 300, '{"query": "bread", "cmc_k": -1, "top_k": -1}',
]
RAW_BODIES = [b'{"query": "\xff\xfe"}', b"\xef\xbb\xbf" + b'{"query": "bread"}', '{"query": "bread"}'.encode("utf-16")]
CONTENT_TYPES = [{"content-type": "text/plain"}, {}, {"content-type": "application/json; charset=utf-8"},
                 {"content-type": "Application/JSON"}, {"content-type": "application/vnd.api+json"},
                 {"content-type": "application/json; charset=latin-1"}]


@pytest.fixture(scope="module")
def fake_components(tmp_path_factory):
    tokenizer = packaged_tokenizer()
    biencoder, cross_encoder = tiny_biencoder(tokenizer), tiny_cross_encoder(tokenizer)
    index_dir = tmp_path_factory.mktemp("fast-index")
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, index_dir, progress=False)

    def loader(s: Settings) -> Components:
        cmc = untrained_cmc(biencoder, share_query_tower=True)
        return Components(Searcher(biencoder, SearchIndex.load(index_dir), cmc, cross_encoder, **searcher_options(s)),
                          "cpu")
    return index_dir, loader


def pair(fake_components, **extra):
    index_dir, loader = fake_components
    settings = [Settings(_env_file=None, index_dir=index_dir, model_name="tiny-bert", max_retrieve_k=1000,
                         max_top_k=100, write_batch_wait_ms=0, max_body_bytes=8192, max_header_bytes=4096,
                         fast_search=fast, **extra) for fast in (True, False)]
    return [TestClient(create_app(s, loader=loader)) for s in settings]


def fast_path_of(client: TestClient) -> FastSearch | None:
    return client.app.fast_search


def comparable(response) -> tuple:
    headers = {k: v for k, v in response.headers.items() if k != "content-length"}
    try:
        body = response.json()
    except ValueError:
        return response.status_code, headers, response.content
    if isinstance(body, dict):
        body.pop("request_id", None)
        body.pop("timings_ms", None)
        if "meta" in body:  # a /v2/rerank answer: its id is the request's
            body.pop("id", None)
    return response.status_code, headers, body


def requests_total(client: TestClient) -> dict:
    lines = client.get("/metrics").text.splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines
            if re.match(r"sieve_(requests_total|rejected_total)\{", line)}


def same_answers(fast: TestClient, slow: TestClient, requests: list[tuple[bytes, dict]],
                 path: str = "/search") -> list[int]:
    statuses = []
    for body, headers in requests:
        got, want = fast.post(path, content=body, headers=headers), slow.post(path, content=body, headers=headers)
        assert comparable(got) == comparable(want), (body[:200], headers)
        statuses.append(got.status_code)
    return statuses


def test_fast_path_answers_as_fastapi_does(fake_components):
    fast, slow = pair(fake_components)
    with fast, slow:
        taken = fast_path_of(fast)
        assert taken is not None and fast_path_of(slow) is None
        requests = [(b.encode(), JSON) for b in BODIES] + [(b, JSON) for b in RAW_BODIES]
        requests += [(b'{"query": "bread", "top_k": 2}', h) for h in CONTENT_TYPES]
        requests += [(b'{"query": "bread"}', {**JSON, "cache-control": "no-cache"})] * 2  # stored, then fresh
        requests += [(b'{"query": "bread"}', {**JSON, "x-pad": "x" * 5000}),  # past SIEVE_MAX_HEADER_BYTES: 400
                     (b'{"query": "bread", "x": "' + b"y" * 9000 + b'"}', JSON),  # past SIEVE_MAX_BODY_BYTES: 413
                     (b'{"query": "bread"}', {**JSON, "content-length": "x"})]
        statuses = same_answers(fast, slow, requests)
        assert statuses.count(200) >= 16 and {400, 413, 422} <= set(statuses), statuses
        chunked = [client.post("/search", content=iter([b'{"query": ', b'"bread"}']), headers=JSON)  # no length
                   for client in (fast, slow)]
        assert comparable(chunked[0]) == comparable(chunked[1]) and chunked[0].status_code == 200
        valid = sum(1 for body, headers in requests if headers.get("content-type", "").lower() in
                    ("application/json", "application/json; charset=utf-8") and accepted(body)
                    and len(body) <= 8192 and "x-pad" not in headers and "content-length" not in headers)
        assert taken.answered == valid, (taken.answered, valid)
        assert requests_total(fast) == requests_total(slow)
        assert fast.get("/openapi.json").json() == slow.get("/openapi.json").json()
        other = fast.post("/search/", content=b'{"query": "bread"}', headers=JSON)  # not the fast path's route
        assert other.status_code == 404 and taken.answered == valid


def accepted(body: bytes, schema=SearchRequest) -> bool:
    try:
        schema.model_validate_json(body)
    except ValueError:
        return False
    return True


RERANK_BODIES = [
    # valid: answered by the fast path
    '{"query": "bread", "documents": ["Sourdough bread rises slowly overnight.", "Volcanoes erupt when magma rises."]}',
    '{"query": "bread", "documents": ["a loaf", "lava", "stars"], "top_n": 1, "return_documents": true}',
    '{"query": "bread", "documents": ["a loaf of bread", "lava"], "model": "ce"}',
    '{"query": "bread", "documents": [{"text": "a loaf"}, {"id": "astro-1", "text": "Red giant stars"}, "lava"]}',
    '{"query": "bread", "documents": [{"id": "astro-1"}], "return_documents": true}',
    '{"query": "b\\u00e4ckerei \\u2603", "documents": ["B\\u00e4ckerei \\ud83c\\udf5e", "lava"], "timeout_ms": 5000}',
    # valid for the schema, refused by the handler (4xx from the same code either way)
    '{"query": "bread", "documents": ["a loaf"], "model": "nope"}',
    '{"query": "bread", "documents": [{"id": "no-such-document"}]}',
    # invalid: FastAPI answers them
    '', 'not json', '{"query": "bread"}', '{"query": "bread", "documents": []}', '{"query": "bread", "documents": [""]}',
    '{"query": "bread", "documents": [1]}', '{"query": "bread", "documents": ["a"], "extra": 1}',
    '{"query": "bread", "documents": ["\\ud800"]}', '{"query": "bread", "documents": ["a"], "top_n": 0}',
    '{"query": "bread", "documents": ["a"], "top_n": "1"}', '{"query": "bread", "documents": [{"id": "a", "x": 1}]}',
    '{"query": "", "documents": ["a"]}', '{"query": "bread", "documents": ["a"]', '[1, 2]',
]


COHERE_BODIES = [
    # valid: answered by the fast path
    '{"model": "rerank-v3.5", "query": "bread", "documents": ["Sourdough bread rises.", "Volcanoes erupt."]}',
    '{"model": "ce", "query": "bread", "documents": ["a loaf", "lava", "stars"], "top_n": 1}',
    '{"model": "cmc", "query": "bread", "documents": ["a loaf of bread", "lava"], "max_tokens_per_doc": 2}',
    '{"model": "rerank-english-v3.0", "query": "b\\u00e4ckerei", "documents": ["B\\u00e4ckerei", "x"], "priority": 0}',
    '{"model": "ce", "query": "bread", "documents": ["a loaf", "lava", "stars"], "top_n": null}',
    # valid for the schema, refused by the handler (4xx from the same code either way)
    '{"model": "nope", "query": "bread", "documents": ["a loaf"]}',
    # invalid: FastAPI answers them
    '', 'not json', '{"query": "bread", "documents": ["a"]}', '{"model": "ce", "query": "bread", "documents": []}',
    '{"model": "ce", "query": "bread", "documents": [""]}', '{"model": "ce", "query": "bread", "documents": [1]}',
    '{"model": "ce", "query": "bread", "documents": [{"text": "a"}]}',
    '{"model": "ce", "query": "bread", "documents": ["a"], "extra": 1}', '{"model": "ce", "query": "a", "timeout_ms": 5}',
    '{"model": "ce", "query": "bread", "documents": ["a"], "top_n": 0}',
    '{"model": "ce", "query": "bread", "documents": ["a"], "max_tokens_per_doc": "2"}',
    '{"model": "ce", "query": "", "documents": ["a"]}', '{"model": "ce", "query": "bread", "documents": ["a"]', '[1]',
]


@pytest.mark.parametrize("path, bodies, schema", [("/rerank", RERANK_BODIES, RerankRequest),
                                                  ("/v2/rerank", COHERE_BODIES, CohereRerankRequest)])
def test_fast_path_reranks_as_fastapi_does(fake_components, path, bodies, schema):
    fast, slow = pair(fake_components)
    with fast, slow:
        taken = fast_path_of(fast)
        requests = [(b.encode(), JSON) for b in bodies]
        requests += [(bodies[0].encode(), h) for h in CONTENT_TYPES]
        requests += [(b'{"model": "ce", "query": "bread", "documents": ["' + b"y" * 9000 + b'"]}', JSON)]  # 413
        statuses = same_answers(fast, slow, requests, path)
        assert statuses.count(200) >= 6 and {400, 413, 422} <= set(statuses) and 500 not in statuses, statuses
        valid = sum(1 for body, headers in requests if headers.get("content-type", "").lower() in
                    ("application/json", "application/json; charset=utf-8") and accepted(body, schema)
                    and len(body) <= 8192)
        assert taken.answered == valid > 5, (taken.answered, valid)
        assert requests_total(fast) == requests_total(slow)
        answer = fast.post(path, json={"query": "bread", "documents": ["lava", "a loaf of bread"], "model": "ce"})
        assert answer.status_code == 200 and len(answer.json()["results"]) == 2
        assert answer.json()["request_id" if path == "/rerank" else "id"]


def test_fast_path_guards_as_fastapi_does(fake_components):
    """API keys and a rate limit (a clock that stands still, so both apps' buckets hold the same tokens)."""
    fast, slow = pair(fake_components, api_keys=KEY, rate_limit_per_s=0.5, rate_limit_burst=3)
    with fast, slow:
        for client in (fast, slow):
            client.app.state.limiter = RateLimiter(0.5, 3, clock=lambda: 1000.0)
        ok = {**JSON, "authorization": f"Bearer {KEY}"}
        requests = [(b'{"query": "bread"}', JSON), (b'{"query": "bread"}', {**JSON, "authorization": "Bearer wrong"}),
                    (b'{"query": "bread"}', {**JSON, "authorization": KEY}),
                    (b'{"query": "bread"}', {**JSON, "authorization": f"bearer   {KEY}  "}),
                    (b'{"query": 1}', JSON), (b'{"query": 1}', ok), (b"not json", {**JSON, "authorization": "x"})]
        requests += [(b'{"query": "bread", "top_k": 2}', ok)] * 4  # the burst of 3 spent: 429 with Retry-After
        statuses = same_answers(fast, slow, requests)
        assert {200, 401, 422, 429} <= set(statuses), statuses
        assert requests_total(fast) == requests_total(slow)
        assert fast_path_of(fast).answered > 0


def test_a_stalled_query_encoder_is_a_503_on_both_lanes(fake_components):
    """A query batcher that never answers (pipeline/searcher.py `encoded`): 503 encoder_timeout with Retry-After
    once the deadline and the grace have passed, not a request held open and not a 500."""
    from concurrent.futures import Future

    index_dir, loader = fake_components

    def stalled(s: Settings) -> Components:
        components = loader(s)
        components.searcher.query_runner = lambda tower: type("Stalled", (), {"submit": lambda self, item: Future()})()
        return components

    for fast in (True, False):
        settings = Settings(_env_file=None, index_dir=index_dir, model_name="tiny-bert", fast_search=fast)
        with TestClient(create_app(settings, loader=stalled)) as client:
            response = client.post("/search", json={"query": "bread", "timeout_ms": 1},
                                   headers={"cache-control": "no-cache"})
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "encoder_timeout" and response.headers["retry-after"] == "1"
