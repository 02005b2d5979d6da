"""Searcher.replace_model, the live swap of a stage's model (a newly adapted CMC): the next request gets the new
model with its own batch runner, a request that already took the old model keeps it, and a CMC whose query tower is
the searcher's bi-encoder still shares it (the query is encoded once)."""
from __future__ import annotations

import dataclasses

from sieve.index import SearchIndex, build_index, read_beir_corpus
from sieve.models.cmc import randomize_gates
from sieve.models.cmc_checkpoint import untrained_cmc
from sieve.pipeline.searcher import Searcher, SearchParams
from tests.conftest import DEMO_CORPUS
from tests.fakes import tiny_biencoder

PARAMS = SearchParams("how do volcanoes erupt", top_k=5, retrieve_k=20, rerank="cmc", retriever="be")


def cmc_scores(searcher: Searcher) -> list[float]:
    return [round(float(s), 5) for s in searcher.search(PARAMS).candidates.scores["cmc"]]


def test_a_replaced_cmc_serves_the_next_request_and_shares_the_bi_encoder(tmp_path):
    biencoder = tiny_biencoder()
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, tmp_path, progress=False)
    with SearchIndex.load(tmp_path) as index:
        searcher = Searcher(biencoder, index, untrained_cmc(biencoder, share_query_tower=True))
        try:
            before, taken = cmc_scores(searcher), searcher.check_params(PARAMS)  # a request that took the old CMC
            fresh = untrained_cmc(searcher.biencoder, share_query_tower=True)
            fresh = dataclasses.replace(fresh, model=randomize_gates(fresh.model, scale=1.0, seed=3), name="new")
            searcher.replace_model("cmc", fresh)
            assert searcher.cmc.name == "new" and searcher.cmc.query_tower is searcher.biencoder
            assert cmc_scores(searcher) != before
            old_model = dict((spec.name, model) for spec, model in taken)["cmc"]
            assert old_model.name == "cmc-untrained"  # what the in-flight request planned with is untouched
            keys = [k for k in searcher.runners.runners if k.startswith("cmc:")]
            assert len(keys) == 2, keys  # each CMC batched by its own runner, never one runner for both
        finally:
            searcher.close()
