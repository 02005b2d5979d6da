"""/rerank in the Cohere / TEI shape, with texts, indexed ids, and the cross-encoder."""
from __future__ import annotations

import math

from sieve.index import read_beir_corpus
from tests.conftest import DEMO_CORPUS

TEXTS = ["The Roman legions built roads across the empire.",
         "A telescope collects light from distant galaxies.",
         "Knead the dough and let it rise before baking bread."]


def test_rerank_texts_with_cmc(client):
    out = client.post("/rerank", json={"query": "how is bread baked", "documents": TEXTS, "return_documents": True})
    assert out.status_code == 200, out.text
    body = out.json()
    assert [r["index"] for r in body["results"]][0] == 2
    assert sorted(r["index"] for r in body["results"]) == [0, 1, 2]
    assert body["results"][0]["document"]["text"] == TEXTS[2]
    assert body["timings_ms"]["candidate_encode"] > 0


def test_indexed_ids_reuse_stored_vectors_and_score_like_their_text(client):
    docs = read_beir_corpus(DEMO_CORPUS)[:4]
    by_id = client.post("/rerank", json={"query": "stars and planets", "documents": [{"id": d.id} for d in docs]}).json()
    by_text = client.post("/rerank", json={"query": "stars and planets", "documents": [d.full_text for d in docs]}).json()
    assert "candidate_encode" not in by_id["timings_ms"]  # nothing encoded on the fly
    assert [r["index"] for r in by_id["results"]] == [r["index"] for r in by_text["results"]]
    for a, b in zip(by_id["results"], by_text["results"]):
        assert math.isclose(a["relevance_score"], b["relevance_score"], abs_tol=1e-4)


def test_top_n_limits_results(client):
    out = client.post("/rerank", json={"query": "galaxies", "documents": TEXTS, "top_n": 1}).json()
    assert len(out["results"]) == 1 and out["results"][0]["index"] == 1


def test_cross_encoder_rerank_and_search(ce_server, ce_checkpoint):
    with ce_server.client() as client:
        out = client.post("/rerank", json={"query": "bread", "documents": TEXTS, "model": "ce"})
        assert out.status_code == 200, out.text
        assert len(out.json()["results"]) == 3
        body = client.post("/search", json={"query": "telescopes and galaxies", "top_k": 8, "cmc_k": 4,
                                            "cross_encoder": True}).json()
        assert body["stages"] == ["retrieve", "cmc", "ce"] and body["timings_ms"]["ce"] > 0
        ce_scores = [r["scores"]["ce"] for r in body["results"]]
        assert all(s is not None for s in ce_scores[:4]) and all(s is None for s in ce_scores[4:])
        assert ce_scores[:4] == sorted(ce_scores[:4], reverse=True)
        assert client.get("/readyz").json()["models"]["cross_encoder"] == ce_checkpoint.name
        # cross_encoder unset: off (SIEVE_DEFAULT_CROSS_ENCODER false: the CE lowers the transfer report), even
        # on a server that has one; true asks for it (default cmc_k 16); false stops at CMC
        default = client.post("/search", json={"query": "telescopes and galaxies", "top_k": 20}).json()
        assert default["stages"] == ["retrieve", "cmc"] and default["timings_ms"].get("ce") is None
        asked = client.post("/search", json={"query": "telescopes and galaxies", "top_k": 20, "cross_encoder": True})
        assert sum(r["scores"].get("ce") is not None for r in asked.json()["results"]) == 16
        off = client.post("/search", json={"query": "telescopes and galaxies", "top_k": 20, "cross_encoder": False})
        assert off.json()["stages"] == ["retrieve", "cmc"]
