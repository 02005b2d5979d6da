"""The MixEncoder and late-interaction stages on a real index: stored context embeddings give the on-the-fly
scores, only the head of the list is scored when asked, /rerank-shaped inputs (texts outside the index) work, and
the Searcher selects both stages (rerank="mix", ce_model="ce_late", /rerank models "mix" and "ce_late")."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertModel

from sieve.index import SearchIndex, build_index, read_beir_corpus
from sieve.models.ce_heads import new_head
from sieve.models.cross_encoder import CrossEncoder
from sieve.research.mix.runtime import STORE, MixRuntime, context_tokens
from sieve.research.mix.model import MixConfig, MixEncoder
from sieve.models.weights import default_model_path
from sieve.pipeline.candidates import Candidates
from sieve.research.late import LateCrossEncoderRerank
from sieve.research.mix.stage import MixRerank
from sieve.pipeline.searcher import RerankItem, SearchParams, Searcher
from sieve.pipeline.state import QueryState
from tests.conftest import DEMO_CORPUS

QUERY = "volcano lava eruption"


def tiny_config(tokenizer, **extra) -> BertConfig:
    return BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=512, **extra)


@pytest.fixture(scope="module")
def tiny_mix() -> MixRuntime:
    """A real MixRuntime around a 2-layer random BERT (fake only at the model), k = 2 contexts."""
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    tokenizer.add_tokens(context_tokens(2), special_tokens=True)
    torch.manual_seed(0)
    module = MixEncoder(BertModel(tiny_config(tokenizer), add_pooling_layer=False), MixConfig(contexts=2))
    return MixRuntime(module, tokenizer, name="tiny-mix", weights_hash="tiny-mix", batch_size=16)


@pytest.fixture(scope="module")
def tiny_late() -> CrossEncoder:
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    torch.manual_seed(0)
    classifier = AutoModelForSequenceClassification.from_config(tiny_config(tokenizer, num_labels=1))
    scorer = new_head("cls+late", classifier, tokenizer, {"dim": 8}).eval()
    return CrossEncoder(scorer, tokenizer, name="tiny-late", weights_hash="tiny-late", batch_size=8)


@pytest.fixture(scope="module")
def mix_index(tmp_path_factory, biencoder, tiny_mix):
    """No embedding cache: the tiny model's identity ("tiny-mix") does not change with its weights."""
    path = tmp_path_factory.mktemp("mix-index")
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, path, cache_dir=None, progress=False,
                extra_stores={STORE: tiny_mix})
    with SearchIndex.load(path) as index:
        yield index


def retrieved(index, biencoder, k: int) -> QueryState:
    state = QueryState(QUERY, index=index)
    vector = biencoder.encode_queries([QUERY])[0].float().cpu().numpy()[None]
    scores, rows = index.search(vector, k)
    state.candidates = Candidates(rows=rows[0], scores={"retrieve": scores[0]})
    return state


def test_mix_stage_scores_from_the_store_as_on_the_fly_and_sorts(mix_index, biencoder, tiny_mix):
    state = MixRerank(tiny_mix, mix_index)(retrieved(mix_index, biencoder, 20))
    cands = state.candidates
    texts = [d.full_text for d in mix_index.documents(cands.rows)]
    np.testing.assert_allclose(cands.scores["mix"], tiny_mix.score(QUERY, texts).numpy(), rtol=0, atol=1e-5)
    assert (np.diff(cands.scores["mix"]) <= 0).all() and state.counts["mix"] == 20 and "mix" in state.timings_ms


def test_mix_stage_with_k_scores_the_head_and_keeps_the_tail(mix_index, biencoder, tiny_mix):
    before = retrieved(mix_index, biencoder, 20).candidates
    cands = MixRerank(tiny_mix, mix_index, k=5)(retrieved(mix_index, biencoder, 20)).candidates
    assert set(cands.rows[:5]) == set(before.rows[:5]) and np.array_equal(cands.rows[5:], before.rows[5:])
    assert np.isnan(cands.scores["mix"][5:]).all() and not np.isnan(cands.scores["mix"][:5]).any()


def test_mix_stage_encodes_texts_outside_the_index(mix_index, biencoder, tiny_mix):
    """A /rerank list: two indexed rows and two texts that are not in the index."""
    rows = retrieved(mix_index, biencoder, 2).candidates.rows
    texts = [d.full_text for d in mix_index.documents(rows)] + ["Lava flows from the crater.", "Bread and butter."]
    state = QueryState(QUERY, index=mix_index)
    state.candidates = Candidates(rows=np.array([rows[0], -1, rows[1], -1]), texts=[texts[0], texts[2], texts[1], texts[3]])
    state = MixRerank(tiny_mix, mix_index)(state)
    expected = dict(zip([texts[0], texts[2], texts[1], texts[3]],
                        tiny_mix.score(QUERY, [texts[0], texts[2], texts[1], texts[3]]).numpy()))
    got = dict(zip(state.candidates.texts, state.candidates.scores["mix"]))
    assert got.keys() == expected.keys() and state.counts["candidate_encode"] == 2
    np.testing.assert_allclose([got[t] for t in expected], list(expected.values()), rtol=0, atol=1e-5)


def test_late_cross_encoder_stage_scores_under_its_own_name(mix_index, biencoder, tiny_late):
    state = LateCrossEncoderRerank(tiny_late, mix_index, k=6)(retrieved(mix_index, biencoder, 10))
    cands = state.candidates
    texts = [d.full_text for d in mix_index.documents(cands.rows[:6])]
    np.testing.assert_allclose(cands.scores["ce_late"][:6], tiny_late.score(QUERY, texts).numpy(), rtol=0, atol=1e-4)
    assert np.isnan(cands.scores["ce_late"][6:]).all() and "ce" not in cands.scores
    assert state.counts["ce_late"] == 6 and "ce_late" in state.timings_ms


@pytest.fixture()
def searcher(mix_index, biencoder, tiny_mix, tiny_late):
    s = Searcher(biencoder, mix_index, models={"mix": tiny_mix, "ce_late": tiny_late})
    yield s
    s.close()


def test_searcher_runs_the_mix_and_late_stages_on_request(searcher, tiny_mix):
    out = searcher.search(SearchParams(QUERY, top_k=5, retrieve_k=30, rerank="mix", cmc_k=8, cross_encoder=True, retriever="be",
                                       ce_model="ce_late"))
    assert out.state.ran == ["retrieve", "mix", "ce_late"] and out.final_stage == "ce_late"
    assert out.state.counts == {"retrieve": 30, "mix": 30, "ce_late": 8}
    alone = searcher.search(SearchParams(QUERY, top_k=30, retrieve_k=30, rerank="mix", cmc_k=8))
    texts = [d.full_text for d in searcher.index.documents(alone.candidates.rows)]
    np.testing.assert_allclose(alone.candidates.scores["mix"], tiny_mix.score(QUERY, texts).numpy(), rtol=0, atol=1e-5)


def test_searcher_rerank_models_mix_and_ce_late(searcher):
    items = [RerankItem(text="Bread rises in the oven."), RerankItem(text="Lava pours out of the volcano."),
             RerankItem(id=searcher.index.ids([0])[0])]
    for model in ("mix", "ce_late"):
        out = searcher.rerank(QUERY, items, model, top_n=3)
        assert out.final_stage == model and sorted(out.candidates.origin.tolist()) == [0, 1, 2]
        assert (np.diff(out.candidates.scores[model]) <= 0).all()


def test_unconfigured_stages_are_refused_clearly(mix_index, biencoder):
    from sieve.pipeline.errors import StageUnavailable

    from sieve.pipeline.errors import RequestError

    plain = Searcher(biencoder, mix_index)
    asks = [lambda: plain.search(SearchParams(QUERY, rerank="mix", retrieve_k=10, top_k=5, cmc_k=5)),
            lambda: plain.search(SearchParams(QUERY, rerank="none", retrieve_k=10, top_k=5, cmc_k=5, cross_encoder=True,
                                              ce_model="ce_late")),
            lambda: plain.rerank(QUERY, [RerankItem(text="x")], "mix", top_n=1)]
    try:
        for ask, setting in zip(asks, ["SIEVE_MIX_PATH", "SIEVE_LATE_CE_PATH", "SIEVE_MIX_PATH"]):
            with pytest.raises(StageUnavailable) as refused:
                ask()
            assert setting in refused.value.allowed
        with pytest.raises(RequestError, match="ce_model 'late'") as bad:
            plain.search(SearchParams(QUERY, rerank="none", retrieve_k=10, top_k=5, cmc_k=5, ce_model="late"))
        assert bad.value.allowed == "ce | ce_late (none loaded on this server)"
    finally:
        plain.close()


def test_sieve_index_add_store_writes_the_mix_context_store(tiny_mix, biencoder, cache_dir, tmp_path, monkeypatch):
    """Offline precomputation from the command line: the store holds exactly what the runtime computes."""
    from sieve.cli import main

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    tiny_mix.save(tmp_path / "mix")
    docs = read_beir_corpus(DEMO_CORPUS)[:12]
    build_index(docs, biencoder, tmp_path / "index", cache_dir=cache_dir, progress=False)
    main(["index", "add-store", "--index", str(tmp_path / "index"), "--mix-checkpoint", str(tmp_path / "mix")])
    with SearchIndex.load(tmp_path / "index") as index:
        stored = index.embeddings(list(range(12)), store=STORE)
        fresh = MixRuntime.from_pretrained(tmp_path / "mix").encode_documents([d.full_text for d in index.documents(range(12))], progress=False)
        assert index.manifest.version == 2 and stored.shape == (12, 64)
    np.testing.assert_allclose(stored, fresh, rtol=0, atol=1e-5)
    with pytest.raises(SystemExit, match="add-store: give"):
        main(["index", "add-store", "--index", str(tmp_path / "index")])
