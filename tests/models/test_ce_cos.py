"""Cross-encoder head cls+cos: the masked mean against a loop reference, s_cos against pooling done by hand, the
sum of the two parts, that it ranks sensibly before any training, and the fp16 checkpoint round trip."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from sieve.models.ce_base import masked_mean
from sieve.models.ce_heads import load_classifier, new_head, read_head
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.models.weights import default_model_path

QUERY = "how do volcanoes erupt"
DOCS = ["Lava is molten rock that erupts from volcanoes when magma pressure builds.",
        "Bread dough rises with yeast before baking.", "Penguins live in colonies on the Antarctic ice."]


@pytest.fixture(scope="module")
def cos_ce() -> CrossEncoder:
    torch.manual_seed(0)
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    scorer = new_head("cls+cos", load_classifier(path), tokenizer)
    return CrossEncoder(scorer, tokenizer, name="cos", weights_hash="unsaved", lengths=PairLengths(64, 128))


def test_masked_mean_matches_a_loop_reference():
    g = torch.Generator().manual_seed(0)
    states, mask = torch.randn(4, 9, 5, generator=g), torch.rand(4, 9, generator=g) > 0.5
    mask[0] = False  # no token at all: zeros, not NaN
    expected = torch.stack([states[b][mask[b]].mean(0) if mask[b].any() else torch.zeros(5) for b in range(4)])
    torch.testing.assert_close(masked_mean(states, mask), expected)


def test_cos_part_is_the_scaled_cosine_of_the_pooled_segments(cos_ce):
    batch = cos_ce.tokenize_pairs(QUERY, DOCS)
    with torch.no_grad():
        s_cls, s_cos = cos_ce.scorer.parts(**batch)
        states = cos_ce.scorer.classifier(**batch, output_hidden_states=True).hidden_states[-1]
        total = cos_ce.scorer(**batch)
    sep = cos_ce.tokenizer.sep_token_id
    expected = []
    for b in range(len(DOCS)):
        ids = batch["input_ids"][b][batch["attention_mask"][b].bool()].tolist()
        first, second = ids.index(sep), len(ids) - 1  # [CLS] q [SEP] d [SEP]
        q, d = states[b, 1:first].mean(0), states[b, first + 1:second].mean(0)
        expected.append(20.0 * F.cosine_similarity(q, d, dim=0))
    torch.testing.assert_close(s_cos, torch.stack(expected), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(total, s_cls + s_cos)


def test_untrained_cos_part_already_ranks_the_relevant_document_first(cos_ce):
    with torch.no_grad():
        _, s_cos = cos_ce.scorer.parts(**cos_ce.tokenize_pairs(QUERY, DOCS))
    assert int(s_cos.argmax()) == 0, s_cos


def test_checkpoint_round_trip_through_the_registry(cos_ce, tmp_path):
    with torch.no_grad():
        cos_ce.scorer.scale.fill_(17.5)
    cos_ce.scorer.classifier.save_pretrained(tmp_path)
    cos_ce.tokenizer.save_pretrained(tmp_path)
    cos_ce.scorer.save_head(tmp_path)
    assert read_head(tmp_path) == {"head": "cls+cos"}
    loaded = CrossEncoder.from_pretrained(tmp_path, lengths=PairLengths(64, 128))
    assert loaded.scorer.scale.item() == pytest.approx(17.5)
    torch.testing.assert_close(loaded.score(QUERY, DOCS), cos_ce.score(QUERY, DOCS), rtol=1e-3, atol=1e-3)
