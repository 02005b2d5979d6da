"""What a cached /search result is keyed on: the index's content (not its version number alone), shared between
servers over the real Redis, and a fingerprint that covers every model a request can pick."""
from __future__ import annotations

import copy
from types import SimpleNamespace

from sieve.index import SearchIndex, build_index, read_beir_corpus
from sieve.models.cmc_checkpoint import untrained_cmc
from sieve.pipeline.searcher import Searcher
from sieve.service.app import fingerprint
from sieve.service.components import Components
from sieve.service.config import Settings
from tests.conftest import DEMO_CORPUS
from tests.fakes import packaged_tokenizer, tiny_biencoder, tiny_cross_encoder
from tests.server import Server
from tests.service.conftest import REDIS_URL, redis_or_skip


def test_two_indexes_at_the_same_version_never_serve_each_others_results(demo_index, biencoder, cache_dir,
                                                                         tmp_path, redis_prefix):
    """Server A holds the demo corpus, server B the same corpus without A's best hit; both are version 1, both
    share one Redis and the same models. B must compute its own answer, holding only ids it has."""
    redis_or_skip()
    query = {"query": "red giant stars and the future of the Sun", "top_k": 5}
    docs = read_beir_corpus(DEMO_CORPUS)
    shared = {"SIEVE_REDIS_URL": REDIS_URL, "SIEVE_REDIS_PREFIX": f"{redis_prefix}two-indexes:"}
    a = Server({"SIEVE_INDEX_DIR": str(demo_index), **shared}, tmp_path / "a.log")
    try:
        with a.client() as client:
            from_a = client.post("/search", json=query).json()
        best = from_a["results"][0]["id"]
        b_index = tmp_path / "b-index"
        build_index([d for d in docs if d.id != best], biencoder, b_index, cache_dir=cache_dir, progress=False)
        b = Server({"SIEVE_INDEX_DIR": str(b_index), **shared}, tmp_path / "b.log")
        try:
            with b.client() as client:
                from_b = client.post("/search", json=query).json()
                assert from_b["index_version"] == from_a["index_version"] == 1
                assert not from_b["cached"], "B served a result A computed over other documents"
                ids = [r["id"] for r in from_b["results"]]
                assert best not in ids and all(client.get(f"/documents/{i}").status_code == 200 for i in ids)
                assert client.post("/search", json=query).json()["cached"]  # B's own answer is cached for B
        finally:
            b.stop()
    finally:
        a.stop()


def test_the_fingerprint_covers_every_model_a_request_can_pick(tmp_path):
    tokenizer = packaged_tokenizer()
    biencoder = tiny_biencoder(tokenizer)
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, tmp_path, progress=False)
    index = SearchIndex.load(tmp_path)
    settings = Settings(index_dir=tmp_path)
    searcher = Searcher(biencoder, index, untrained_cmc(biencoder, share_query_tower=True),
                        tiny_cross_encoder(tokenizer))
    try:
        base = fingerprint(Components(searcher, "cpu"), settings)

        def with_model(**models) -> str:  # stage name -> model
            changed = copy.copy(searcher)
            changed.models = {**searcher.models, **models}
            return fingerprint(Components(changed, "cpu"), settings)

        late_one, late_two = tiny_cross_encoder(tokenizer, seed=1), tiny_cross_encoder(tokenizer, seed=2)
        assert base != with_model(ce_late=late_one) != with_model(ce_late=late_two)
        assert with_model(ce_late=late_one) == with_model(ce_late=tiny_cross_encoder(tokenizer, seed=1))  # stable
        assert base != with_model(ce=tiny_cross_encoder(tokenizer, seed=3))
        mix = SimpleNamespace(name="mix", weights_hash="mix-weights-1", lengths="MixLengths(64, 256)")
        assert base != with_model(mix=mix) != with_model(mix=SimpleNamespace(**{**vars(mix), "weights_hash": "2"}))
        built = SimpleNamespace(index=SimpleNamespace(version=1), corpus_hash="c", record={"anchor_rows": [1, 2]})
        anncur = SimpleNamespace(cross_encoder=late_one, index=built)
        other_anchors = SimpleNamespace(cross_encoder=late_one, index=SimpleNamespace(**{**vars(built),
                                                                                         "record": {"anchor_rows": [3]}}))
        assert base != with_model(anncur=anncur) != with_model(anncur=other_anchors)
        assert with_model(anncur=anncur) != with_model(anncur=SimpleNamespace(cross_encoder=late_two, index=built))
    finally:
        searcher.close()
        index.close()
