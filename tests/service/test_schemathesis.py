"""Schemathesis against the OpenAPI schema, over real HTTP (uvicorn in a thread) with tiny random models in the
real runtimes: no 5xx, and every response matches the documented status codes, content types and schemas."""
from __future__ import annotations

import threading
import time

import pytest
import schemathesis  # the [test] extra: imported, never skipped
import uvicorn
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (content_type_conformance, negative_data_rejection, not_a_server_error,
                                 response_headers_conformance, response_schema_conformance, status_code_conformance)

from sieve.index import SearchIndex, build_index, read_beir_corpus
from sieve.models.cmc_checkpoint import untrained_cmc
from sieve.pipeline.searcher import Searcher
from sieve.service.app import create_app
from sieve.service.components import Components
from sieve.service.config import Settings
from sieve.service.runtime import searcher_options
from tests.conftest import DEMO_CORPUS
from tests.fakes import packaged_tokenizer, tiny_biencoder, tiny_cross_encoder
from tests.server import free_port

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
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

    server = uvicorn.Server(uvicorn.Config(create_app(app_settings, loader=loader), host="127.0.0.1",
                                           port=free_port(), log_level="warning"))
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
