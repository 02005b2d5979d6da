"""annCUR end to end: `sieve index anncur` over the demo index (real untrained cross-encoder, tiny k_q / k_i),
then POST /search with retriever "anncur" through a real server, checked against the CUR approximation and the
cross-encoder computed here; errors; and the searcher's refusal of an annCUR index built over other documents."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from sieve.index import SearchIndex
from sieve.research.anncur.index import AnnCURIndex
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.research.anncur.stage import AnnCUR
from sieve.pipeline.errors import StageUnavailable
from sieve.pipeline.searcher import SearchParams, Searcher
from tests.server import Server

ANCHOR_QUERIES = ["how do volcanoes erupt", "baking bread at home", "roman legions", "jazz improvisation"]
LENGTHS = PairLengths(16, 32)  # short pairs keep R_anc (4 queries x 60 documents) to seconds


@pytest.fixture(scope="module")
def anncur_dir(demo_index, ce_checkpoint, tmp_path_factory):
    from sieve.cli import main

    root = tmp_path_factory.mktemp("anncur")
    queries = root / "queries.jsonl"
    queries.write_text("".join(json.dumps({"_id": f"a{i}", "text": q}) + "\n" for i, q in enumerate(ANCHOR_QUERIES)))
    main(["index", "anncur", "--index", str(demo_index), "--cross-encoder", str(ce_checkpoint), "--queries",
          str(queries), "--out", str(root / "index"), "--k-q", "4", "--k-i", "3", "--max-length", "32",
          "--query-max-length", "16"])
    return root / "index"


@pytest.fixture(scope="module")
def local(anncur_dir, demo_index, ce_checkpoint):
    """The same cross-encoder (same pair lengths) and indexes, in this process, for expected values."""
    ce = CrossEncoder.from_pretrained(ce_checkpoint, lengths=LENGTHS)
    anncur = AnnCURIndex.load(anncur_dir, model_hash=ce.weights_hash)
    index = SearchIndex.load(demo_index)
    yield SimpleNamespace(ce=ce, anncur=anncur, index=index)
    anncur.close()
    index.close()


@pytest.fixture(scope="module")
def anncur_client(demo_index, anncur_dir, ce_checkpoint, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_ANNCUR_DIR": str(anncur_dir),
                  "SIEVE_ANNCUR_CROSS_ENCODER_PATH": str(ce_checkpoint)},
                 tmp_path_factory.mktemp("logs") / "anncur-server.log")
    with srv.client() as client:
        yield client
    srv.stop()


def test_index_records_its_anchors_and_cross_encoder(local):
    record = local.anncur.record
    assert record["k_q"] == 4 and record["k_i"] == 3 and len(record["anchor_ids"]) == 3
    assert record["cross_encoder"]["max_length"] == 32 and record["r_anc"]["pairs"] == 4 * local.index.size
    assert local.anncur.index.manifest.dim == 3 and local.anncur.corpus_hash == local.index.manifest.corpus_hash


def test_search_returns_the_top_of_the_cur_approximation(anncur_client, local):
    r = anncur_client.post("/search", json={"query": "lava flows from a volcano", "retriever": "anncur",
                                            "top_k": 8, "retrieve_k": 20, "cmc_k": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stages"] == ["anncur"] and body["timings_ms"]["anncur"] > 0 and body["timings_ms"].get("be_encode") is None
    anchor_scores = local.ce.score("lava flows from a volcano", local.anncur.anchor_texts).numpy()
    scores, rows = local.anncur.search(anchor_scores, 8)
    assert [h["id"] for h in body["results"]] == local.index.ids(rows)
    np.testing.assert_allclose([h["scores"]["retrieve"] for h in body["results"]], scores, atol=1e-4)
    assert all(h["scores"].get("ce") is None and h["scores"].get("cmc") is None for h in body["results"])


def test_exact_rerank_scores_the_anchors_and_the_best_others(anncur_client, local):
    query = "bread dough and yeast"
    r = anncur_client.post("/search", json={"query": query, "retriever": "anncur", "cross_encoder": True,
                                            "cmc_k": 4, "top_k": 12, "retrieve_k": 20})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stages"] == ["anncur", "ce"]
    hits = body["results"]
    scored = [h for h in hits if h["scores"].get("ce") is not None]
    assert len(scored) == 3 + 4  # the anchors and cmc_k others
    assert hits[:7] == scored and set(local.anncur.record["anchor_ids"]) <= {h["id"] for h in scored}
    ce_scores = [h["scores"]["ce"] for h in scored]
    assert ce_scores == sorted(ce_scores, reverse=True) and [h["score"] for h in scored] == ce_scores
    texts = [d.full_text for d in local.index.documents(local.index.rows_for_ids([h["id"] for h in scored]))]
    np.testing.assert_allclose(ce_scores, local.ce.score(query, texts).numpy(), atol=1e-4)
    approx = [h["scores"]["retrieve"] for h in hits[7:]]
    assert approx == sorted(approx, reverse=True)  # below them, the approximate order


def test_bad_combinations_are_4xx(anncur_client, client, ce_checkpoint):
    r = anncur_client.post("/search", json={"query": "x", "retriever": "anncur", "rerank": "cmc"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "rerank"
    r = anncur_client.post("/search", json={"query": "x", "retriever": "splade"})
    assert r.status_code == 422 and "hybrid" in r.text  # the allowed retrievers are named
    r = anncur_client.post("/search", json={"query": "x", "retriever": "anncur", "cross_encoder": True,
                                            "ce_model": "ce_late", "cmc_k": 4})
    assert r.status_code == 422 and r.json()["error"]["field"] == "ce_model"
    r = client.post("/search", json={"query": "x", "retriever": "anncur"})  # a server without SIEVE_ANNCUR_DIR
    assert r.status_code == 400 and r.json()["error"]["field"] == "retriever"
    assert anncur_client.get("/readyz").json()["models"]["anncur"] == ce_checkpoint.name
    r = anncur_client.post("/search", json={"query": "lava", "top_k": 3})  # the bi-encoder path is unchanged
    assert r.status_code == 200 and r.json()["stages"] == ["retrieve", "cmc"]


def test_an_annCUR_index_over_other_documents_is_refused(local, biencoder):
    searcher = Searcher(biencoder, local.index, models={"anncur": AnnCUR(local.anncur, local.ce)})
    try:
        params = SearchParams("q", retriever="anncur", rerank="none")
        [(spec, model)] = searcher.check_params(params, local.index)
        assert spec.name == "anncur" and model.index is local.anncur
        other = SimpleNamespace(manifest=SimpleNamespace(corpus_hash="0" * 64))
        with pytest.raises(StageUnavailable, match="other documents"):
            searcher.check_params(params, other)
    finally:
        searcher.close()
