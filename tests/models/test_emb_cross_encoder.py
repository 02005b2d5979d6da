"""The [emb] cross-encoder: marker placement, the score against a hand-built reference, the fp16 checkpoint round
trip through CrossEncoder.from_pretrained (head registry), and clear refusals."""
from __future__ import annotations

import json

import pytest
import torch

from transformers import AutoModelForSequenceClassification, AutoTokenizer

from sieve.models.ce_heads import new_head, read_head
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.research.heads.emb import DOC_MARKER, QUERY_MARKER, EmbPairScorer, marker_positions
from sieve.models.weights import default_model_path
from sieve.training.ce_train import save_fp16

DOCS = ["Lava is molten rock that erupts from volcanoes.", "Bread dough rises with yeast before baking.",
        "Penguins live in colonies on the Antarctic ice.", " ".join(["magma"] * 300)]


@pytest.fixture(scope="module")
def emb_ce() -> CrossEncoder:
    """A fresh [emb] head on the packaged MiniLM, built as the trainer builds it (models/ce_heads.new_head)."""
    torch.manual_seed(0)
    path = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    classifier = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    scorer = new_head("emb", classifier, tokenizer)
    return CrossEncoder(scorer, tokenizer, name="emb-test", weights_hash="unsaved", lengths=PairLengths(16, 48))


def tokens(ce, row) -> list[str]:
    return ce.tokenizer.convert_ids_to_tokens(row[row != ce.tokenizer.pad_token_id])


def test_markers_open_each_segment_once_even_when_cut_or_typed_by_the_user(emb_ce):
    query = f"what is lava {QUERY_MARKER} {DOC_MARKER} " + "volcano " * 40
    batch = emb_ce.tokenize_pairs(query, DOCS)
    assert batch["input_ids"].shape[1] == 48  # the 300-word document was cut to the pair budget
    for row, types in zip(batch["input_ids"], batch["token_type_ids"]):
        toks = tokens(emb_ce, row)
        assert toks[:2] == ["[CLS]", QUERY_MARKER] and toks.count(QUERY_MARKER) == 1 and toks.count(DOC_MARKER) == 1
        d = toks.index(DOC_MARKER)
        assert toks[d - 1] == "[SEP]" and types[d] == 1 and types[1] == 0
        assert d - 2 <= 16  # the query (its marker included) kept to its own budget


def test_score_is_the_scaled_dot_product_of_the_marker_states(emb_ce):
    batch = emb_ce.tokenize_pairs("what is lava", DOCS)
    with torch.no_grad():
        hidden = emb_ce.scorer.classifier.base_model(**batch).last_hidden_state  # (B, L, d)
        ids = batch["input_ids"]
        q_id, d_id = emb_ce.tokenizer.convert_tokens_to_ids([QUERY_MARKER, DOC_MARKER])
        expected = torch.stack([hidden[i, (ids[i] == q_id).nonzero()[0, 0]] @ hidden[i, (ids[i] == d_id).nonzero()[0, 0]]
                                for i in range(len(ids))]) * emb_ce.scorer.scale
        got = emb_ce.scorer(**batch)
    assert got.shape == (len(DOCS),)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(emb_ce.score("what is lava", DOCS), got, rtol=1e-5, atol=1e-5)  # length-sorted batches
    q, d = emb_ce.scorer.marker_embeddings(**batch)
    assert q.shape == d.shape == (len(DOCS), 384)


def test_a_pair_without_its_marker_is_refused():
    ids = torch.tensor([[101, 7, 8, 102], [101, 9, 7, 102]])
    assert marker_positions(ids, 7).tolist() == [1, 2]
    with pytest.raises(ValueError, match="exactly once"):
        marker_positions(ids, 8)  # missing from the second pair
    with pytest.raises(ValueError, match="exactly once"):
        marker_positions(torch.tensor([[101, 7, 7, 102]]), 7)  # twice


def test_fp16_checkpoint_round_trips_through_the_head_registry(emb_ce, tmp_path):
    save_fp16(emb_ce, tmp_path)  # the trainer's writer: HF directory + the head's sieve_head.json
    head = read_head(tmp_path)
    assert head["head"] == "emb" and head["scale"] == pytest.approx(384 ** -0.5)
    loaded = CrossEncoder.from_pretrained(tmp_path, lengths=PairLengths(16, 48))
    assert isinstance(loaded.scorer, EmbPairScorer) and len(loaded.weights_hash) == 64
    assert len(loaded.tokenizer) == len(emb_ce.tokenizer) == emb_ce.scorer.classifier.config.vocab_size
    expected, got = emb_ce.score("what is lava", DOCS), loaded.score("what is lava", DOCS)
    assert expected.max() - expected.min() > 0.05
    torch.testing.assert_close(got, expected, rtol=0, atol=5e-3)
    assert torch.equal(loaded.tokenize_pairs("q", DOCS)["input_ids"], emb_ce.tokenize_pairs("q", DOCS)["input_ids"])


def test_the_registry_knows_the_emb_head(tmp_path):
    (tmp_path / "sieve_head.json").write_text(json.dumps({"head": "emb-typo"}))
    with pytest.raises(ValueError, match="Sieve knows cls, gated, .*emb"):
        read_head(tmp_path)
