"""MixEncoder: one query encoding whatever N, candidates independent of each other, the interaction layer against
transformers' own layer run on [query; contexts] with a one-way mask, stored contexts equal on-the-fly ones, and
the fp16 checkpoint round trip."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sieve.index import Document, SearchIndex, build_index
from sieve.research.mix.runtime import STORE, MixLengths, MixRuntime
from sieve.research.mix.model import MixConfig
from sieve.models.weights import default_model_path

DOCS = ["Lava is molten rock that erupts from volcanoes.", "Bread dough rises with yeast before baking.",
        "Penguins live in colonies on the Antarctic ice.", "A violin is played with a bow.",
        "Comets grow tails of ice and dust near the sun.", "Chess openings such as the gambit trade a pawn.",
        " ".join(["magma"] * 300)]
QUERY = "how do volcanoes erupt"


def new_runtime(**cfg) -> MixRuntime:
    torch.manual_seed(0)
    rt = MixRuntime.new(default_model_path(), MixConfig(**cfg), name="mix-test", lengths=MixLengths(32, 64), batch_size=3)
    rt.module.eval()
    with torch.no_grad():  # untrained gates sit at 0.5; random ones make the test see every term of the update
        for gate in rt.module.gates:
            gate.weight.normal_(0, 0.05)
    return rt


@pytest.fixture(scope="module")
def mix() -> MixRuntime:
    return new_runtime(contexts=2, interaction_layers=2)


def count_calls(module: torch.nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_one_query_encoding_per_request_whatever_n(mix):
    many = (DOCS * 8)[:50]
    contexts = mix.encode_documents(many, progress=False)
    assert contexts.shape == (50, mix.dim) and mix.dim == 2 * 384
    calls = count_calls(mix.module.encoder)
    for n in (1, 7, 50):
        before = calls[0]
        mix.score_states(mix.query_states(QUERY), contexts[:n], chunk=16)  # 50 candidates: 4 chunks
        assert calls[0] - before == 1, n


def test_permuting_candidates_permutes_scores_and_others_do_not_matter(mix):
    contexts = mix.encode_documents(DOCS, progress=False)
    states = mix.query_states(QUERY)
    scores = mix.score_states(states, contexts)
    perm = np.random.default_rng(0).permutation(len(DOCS))
    np.testing.assert_allclose(mix.score_states(states, contexts[perm]), scores[perm], rtol=0, atol=1e-5)
    np.testing.assert_allclose(mix.score_states(states, contexts[[4]]), scores[[4]], rtol=0, atol=1e-5)
    assert scores.max() - scores.min() > 0.01  # the candidates are told apart


def test_context_layer_equals_the_transformer_layer_with_a_one_way_mask(mix):
    """Interaction layer i = the encoder's own layer over [query tokens; candidate's k contexts] where the query
    cannot see the contexts and the contexts see everything: the contexts' outputs must agree."""
    module = mix.module
    q = mix.tokenize_queries([QUERY])
    states = module.encode_query(**q)
    with torch.no_grad():
        contexts = module.encode_candidates(**mix.tokenize_candidates(DOCS[:2]))  # (2, k, d)
        got = module.context_layer(0, contexts, states.inputs[0], states.mask)[0]  # (2, k, d)
        T, k = states.inputs[0].shape[1], contexts.shape[1]
        mask = torch.zeros(T + k, T + k)
        mask[:T, T:] = float("-inf")  # query tokens never attend to the candidate
        for j in range(2):
            seq = torch.cat([states.inputs[0][0], contexts[j]])[None]  # (1, T + k, d)
            out = module.interaction_layer(0)(seq, attention_mask=mask[None, None])
            out = out[0] if isinstance(out, tuple) else out
            torch.testing.assert_close(out[0, T:], got[j], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out[0, :T], states.outputs[0][0], rtol=1e-4, atol=1e-4)


def test_stored_context_embeddings_score_as_on_the_fly_ones(mix, biencoder, tmp_path):
    docs = [Document(f"d{i}", "", text) for i, text in enumerate(DOCS)]
    build_index(docs, biencoder, tmp_path / "index", cache_dir=None, progress=False, extra_stores={STORE: mix})
    index = SearchIndex.load(tmp_path / "index", model_name=biencoder.name, model_hash=biencoder.weights_hash,
                             dim=biencoder.dim)
    try:
        rows = index.rows_for_ids(["d3", "d0", "d6", "d1"])
        stored = mix.score_states(mix.query_states(QUERY), index.embeddings(rows, store=STORE))
        fresh = mix.score(QUERY, [doc.full_text for doc in index.documents(rows)]).numpy()
        np.testing.assert_allclose(stored, fresh, rtol=0, atol=1e-5)
        assert index.manifest.stores[STORE]["dim"] == mix.dim
    finally:
        index.close()


def test_fp16_checkpoint_round_trip(mix, tmp_path):
    mix.save(tmp_path)
    saved = json.loads((tmp_path / "mixencoder.json").read_text())
    assert saved["config"] == {"contexts": 2, "interaction_layers": 2, "scale": 20.0}
    loaded = MixRuntime.from_pretrained(tmp_path, lengths=MixLengths(32, 64))
    assert loaded.context_ids == mix.context_ids and len(loaded.weights_hash) == 64
    expected, got = mix.score(QUERY, DOCS), loaded.score(QUERY, DOCS)
    assert expected.max() - expected.min() > 0.01
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-3)
    with pytest.raises(FileNotFoundError, match="not a MixEncoder checkpoint"):
        MixRuntime.from_pretrained(default_model_path())


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError, match="interaction_layers must be in 1..6"):
        new_runtime(interaction_layers=7)
    with pytest.raises(ValueError, match="contexts must be >= 1"):
        new_runtime(contexts=0)
