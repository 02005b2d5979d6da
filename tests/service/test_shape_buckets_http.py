"""A server with bucketed shapes (SIEVE_SHAPE_BUCKETS=on, what CUDA gets by default) answers what exact inner product
answers: the query padded to its token bucket, CMC's candidate list to its bucket, neither changes a score."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.index import read_beir_corpus
from tests.conftest import DEMO_CORPUS
from tests.server import Server


@pytest.fixture(scope="module")
def bucketed(demo_index, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_SHAPE_BUCKETS": "on", "SIEVE_PRECISION": "fp32",
                  "SIEVE_CACHE_ENABLED": "false"}, tmp_path_factory.mktemp("logs") / "bucketed-server.log")
    yield srv
    srv.stop()


@pytest.mark.parametrize("query", ["cooking pasta sauce", "which volcanoes erupt lava explosively and why"])
def test_bucketed_server_scores_equal_exact_inner_product(bucketed, biencoder, query):
    docs = read_beir_corpus(DEMO_CORPUS)
    vectors = biencoder.encode_documents([d.full_text for d in docs], progress=False)  # (N, d)
    exact = vectors @ biencoder.encode_queries([query])[0].numpy()  # (N,)
    with bucketed.client() as client:
        reply = client.post("/search", json={"query": query, "top_k": 7, "retrieve_k": 21, "retriever": "be",
                                             "rerank": "cmc"})  # 21 candidates: CMC runs at a bucket of 24
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    order = np.argsort(-exact)[:7]
    assert [r["id"] for r in results] == [docs[i].id for i in order]
    for r, i in zip(results, order):  # the identity CMC scores each candidate by its inner product with the query
        assert abs(r["scores"]["cmc"] - exact[i]) < 1e-4 and abs(r["scores"]["retrieve"] - exact[i]) < 1e-4
    assert "shape buckets True, CUDA streams False, CUDA graphs False" in bucketed.log_path.read_text()
