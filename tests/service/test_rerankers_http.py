"""/search and /rerank with the MixEncoder and the late-interaction cross-encoder over real HTTP (tiny random models
saved as real checkpoints: fake only at the model), and the clear refusals when they are not configured."""
from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertModel

from sieve.index import SearchIndex, add_store
from sieve.models.ce_heads import new_head
from sieve.models.cross_encoder import CrossEncoder
from sieve.research.mix.runtime import STORE, MixRuntime, context_tokens
from sieve.research.mix.model import MixConfig, MixEncoder
from sieve.models.weights import default_model_path
from tests.pipeline.test_rerankers import tiny_config
from tests.server import Server
from sieve.training.ce_train import save_fp16


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rerankers")
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    torch.manual_seed(0)
    classifier = AutoModelForSequenceClassification.from_config(tiny_config(tokenizer, num_labels=1))
    late = CrossEncoder(new_head("cls+late", classifier, tokenizer, {"dim": 8}), tokenizer, name="late", weights_hash="-")
    save_fp16(late, root / "late")
    mix_tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    mix_tok.add_tokens(context_tokens(1), special_tokens=True)
    module = MixEncoder(BertModel(tiny_config(mix_tok), add_pooling_layer=False), MixConfig())
    MixRuntime(module, mix_tok, name="mix", weights_hash="-").save(root / "mix")
    return {"late": root / "late", "mix": root / "mix"}


@pytest.fixture(scope="module")
def mix_server(demo_index, checkpoints, tmp_path_factory):
    index_dir = tmp_path_factory.mktemp("mix-index") / "index"
    shutil.copytree(demo_index, index_dir)
    add_store(index_dir, STORE, MixRuntime.from_pretrained(checkpoints["mix"]), cache_dir=None, progress=False)
    srv = Server({"SIEVE_INDEX_DIR": str(index_dir), "SIEVE_MIX_PATH": str(checkpoints["mix"]),
                  "SIEVE_LATE_CE_PATH": str(checkpoints["late"]), "SIEVE_CACHE_ENABLED": "false"},
                 tmp_path_factory.mktemp("logs") / "mix-server.log")
    yield srv
    srv.stop()


def test_search_with_the_mixencoder_then_the_late_cross_encoder(mix_server):
    with mix_server.client() as client:
        models = client.get("/readyz").json()["models"]
        assert models["mix"] == "mix" and models["late_cross_encoder"] == "late"
        response = client.post("/search", json={"query": "volcano eruption", "top_k": 8, "retrieve_k": 30,
                                                "cmc_k": 5, "rerank": "mix"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["stages"] == ["retrieve", "mix"] and body["timings_ms"]["mix"] > 0
        mix = [hit["scores"]["mix"] for hit in body["results"]]
        assert mix == sorted(mix, reverse=True) and [h["score"] for h in body["results"]] == mix
        body = client.post("/search", json={"query": "volcano eruption", "top_k": 8, "retrieve_k": 30, "rerank": "mix",
                                            "cross_encoder": True, "ce_model": "ce_late", "cmc_k": 5}).json()
        assert body["stages"] == ["retrieve", "mix", "ce_late"]
        late = [hit["scores"]["ce_late"] for hit in body["results"][:5]]
        assert None not in late and late == sorted(late, reverse=True)
        assert all(hit["scores"].get("ce_late") is None for hit in body["results"][5:])


def test_rerank_with_the_mixencoder_and_the_late_cross_encoder(mix_server):
    docs = ["Bread rises in a warm oven.", "Lava pours out of an erupting volcano.", {"id": "volcano-1"}]
    with mix_server.client() as client:
        for model in ("mix", "ce_late"):
            response = client.post("/rerank", json={"query": "volcano eruption", "documents": docs, "model": model})
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["model"] == model and sorted(r["index"] for r in body["results"]) == [0, 1, 2]
            scores = [r["relevance_score"] for r in body["results"]]
            assert scores == sorted(scores, reverse=True) and body["timings_ms"][model] > 0


def test_unconfigured_rerankers_answer_400_and_bad_names_422(client):
    refused = client.post("/search", json={"query": "volcano", "rerank": "mix"})
    assert refused.status_code == 400 and "SIEVE_MIX_PATH" in refused.json()["error"]["allowed"]
    refused = client.post("/search", json={"query": "volcano", "cross_encoder": True, "ce_model": "ce_late"})
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "ce_model"
    refused = client.post("/rerank", json={"query": "volcano", "documents": ["lava"], "model": "mix"})
    assert refused.status_code == 400 and "SIEVE_MIX_PATH" in refused.json()["error"]["allowed"]
    assert client.post("/search", json={"query": "volcano", "ce_model": "late"}).status_code == 422


def test_a_mix_checkpoint_without_its_store_in_the_index_is_refused_at_start(demo_index, checkpoints):
    from sieve.service.components import load_components
    from sieve.service.config import Settings

    with pytest.raises(ValueError, match="sieve index add-store"):
        load_components(Settings(index_dir=demo_index, mix_path=checkpoints["mix"], cmc_enabled=False))
    with SearchIndex.load(demo_index) as index:
        assert not index.has_store(STORE)
