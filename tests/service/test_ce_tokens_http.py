"""A served index that keeps the cross-encoder's document token ids (store ce_tokens, models/ce_tokens.py): a write
over HTTP stores the new documents' ids with them, and /search with the cross-encoder scores from the stored ids what
the cross-encoder scores from the texts. A real `sieve serve` with the shipped cross-encoder, in fp32."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.index import SearchIndex, build_index, read_beir_corpus
from sieve.models import ce_tokens
from tests.conftest import DEMO_CORPUS
from tests.server import Server


@pytest.fixture(scope="module")
def shipped_ce():
    from sieve import checkpoints
    from sieve.models.ce_heads import trained_lengths
    from sieve.models.cross_encoder import CrossEncoder

    return CrossEncoder.from_pretrained(checkpoints.CROSS_ENCODER, lengths=trained_lengths(checkpoints.CROSS_ENCODER))


@pytest.fixture(scope="module")
def served(tmp_path_factory, biencoder, shipped_ce, cache_dir):
    index = tmp_path_factory.mktemp("ce-tokens-http") / "index"
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, index, cache_dir=cache_dir, progress=False,
                extra_stores={ce_tokens.STORE: ce_tokens.CETokenStore(shipped_ce)})
    srv = Server({"SIEVE_INDEX_DIR": str(index), "SIEVE_CROSS_ENCODER_ENABLED": "true", "SIEVE_PRECISION": "fp32"},
                 tmp_path_factory.mktemp("logs") / "ce-tokens.log")
    yield srv, index
    srv.stop()


def test_a_write_stores_the_new_documents_ids(served, shipped_ce):
    server, index = served
    doc = {"id": "kombucha-1", "title": "Kombucha", "text": "Kombucha is tea fermented by a culture of yeast and bacteria."}
    with server.client() as client:
        assert client.post("/documents", json={"documents": [doc]}).status_code == 200
    with SearchIndex.load(index) as loaded:
        row = loaded.rows_for_ids([doc["id"]])
        stored = ce_tokens.unpack(loaded.embeddings(row, store=ce_tokens.STORE))
    full_text = f"{doc['title']} {doc['text']}"  # index/corpus.py Document.full_text
    assert stored == ce_tokens.document_ids(shipped_ce.tokenizer, [full_text], shipped_ce.lengths.max_length)
    assert len(stored[0]) > 5


def test_search_scores_from_stored_ids_what_the_texts_score(served, shipped_ce):
    server, _ = served
    query = "fermented tea with yeast"
    with server.client() as client:
        body = client.post("/search", json={"query": query, "top_k": 8, "cross_encoder": True,
                                            "return_documents": True}, headers={"Cache-Control": "no-cache"}).json()
    assert "ce" in body["stages"], body
    hits = [h for h in body["results"] if h["scores"].get("ce") is not None]
    assert len(hits) == 8
    from sieve.index.corpus import Document

    texts = [Document(h["id"], h["document"].get("title") or "", h["document"]["text"]).full_text for h in hits]
    expected = shipped_ce.score(query, texts).numpy()
    np.testing.assert_allclose([h["scores"]["ce"] for h in hits], expected, rtol=1e-4, atol=1e-4)


def test_a_rerank_of_indexed_ids_answers_as_the_same_texts(served):
    """/rerank (model ce) naming indexed documents reads their stored ids: the answer (order, indices, scores,
    documents) is the one for the same texts, mixed with a text of the caller's own."""
    server, index = served
    with SearchIndex.load(index) as loaded:
        docs = loaded.documents(np.arange(6))
    query, own = "how do volcanoes erupt", "Magma rises through the crust and erupts from a vent."
    by_id = [{"id": d.id} for d in docs[:3]] + [own] + [{"id": d.id, "text": d.full_text} for d in docs[3:]]
    by_text = [d.full_text for d in docs[:3]] + [own] + [d.full_text for d in docs[3:]]
    answers = []
    with server.client() as client:
        for documents in (by_id, by_text):
            reply = client.post("/rerank", json={"query": query, "model": "ce", "documents": documents, "top_n": 7,
                                                 "return_documents": True}, headers={"Cache-Control": "no-cache"})
            assert reply.status_code == 200, reply.text
            answers.append(reply.json())
    got, expected = answers
    assert [r["index"] for r in got["results"]] == [r["index"] for r in expected["results"]]
    assert [r["document"]["text"] for r in got["results"]] == [r["document"]["text"] for r in expected["results"]]
    np.testing.assert_allclose([r["relevance_score"] for r in got["results"]],
                               [r["relevance_score"] for r in expected["results"]], rtol=1e-5, atol=1e-5)
