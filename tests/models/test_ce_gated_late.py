"""Cross-encoder head "gated+late": a fresh head scores as the bi-encoder (late weight 0); s_late is the sum-of-max
over the query's and the document's own tokens (a loop reference, special tokens and padding left out); the late
weight and projection learn; the fp16 checkpoint round trip keeps every head tensor."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from sieve.research.heads.gated_late import GatedLateScorer, content_masks
from sieve.models.ce_heads import load_classifier, new_head, read_head
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.models.weights import default_model_path

QUERY = "how do volcanoes erupt"
DOCS = ["Lava is molten rock that erupts from volcanoes when magma pressure builds.",
        "Bread dough rises with yeast before baking.", "Penguins live in colonies on the Antarctic ice, " * 6]


@pytest.fixture()
def late_ce() -> CrossEncoder:
    torch.manual_seed(0)
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    scorer = new_head("gated+late", load_classifier(path), tokenizer, {"dim": 32})
    return CrossEncoder(scorer, tokenizer, name="gated+late", weights_hash="unsaved", lengths=PairLengths(64, 256))


def opened(ce: CrossEncoder) -> CrossEncoder:
    with torch.no_grad():
        ce.scorer.gates.fill_(0.5)
        ce.scorer.late_weight.fill_(0.7)
    return ce


def test_a_fresh_head_scores_exactly_the_bi_encoder_cosine(late_ce, biencoder):
    q = biencoder.encode_queries([QUERY]).float()
    d = torch.from_numpy(biencoder.encode_documents(DOCS, progress=False))
    torch.testing.assert_close(late_ce.score(QUERY, DOCS), 20.0 * (q @ d.T)[0], rtol=1e-4, atol=1e-4)


def test_content_masks_leave_out_special_tokens_and_padding(late_ce):
    tok = late_ce.tokenizer
    batch = late_ce.tokenize_pairs(QUERY, DOCS[:2])  # the second pair is padded
    q_mask, d_mask = content_masks(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                                   late_ce.scorer.special_ids)
    for row, doc in enumerate(DOCS[:2]):
        ids = batch["input_ids"][row]
        assert ids[q_mask[row]].tolist() == tok(QUERY, add_special_tokens=False)["input_ids"]
        assert ids[d_mask[row]].tolist() == tok(doc, add_special_tokens=False)["input_ids"]


def test_late_part_is_the_sum_of_max_of_a_loop_reference(late_ce):
    scorer = opened(late_ce).scorer.eval()
    batch = late_ce.tokenize_pairs(QUERY, DOCS)
    with torch.no_grad():
        s_late = scorer.parts(**batch)[2]
        states = scorer.states(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        vectors = F.normalize(scorer.proj(states), dim=-1)
    q_mask, d_mask = content_masks(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                                   scorer.special_ids)
    for row in range(len(DOCS)):
        total = 0.0
        for i in torch.nonzero(q_mask[row])[:, 0]:
            total += max(float(vectors[row, i] @ vectors[row, j]) for j in torch.nonzero(d_mask[row])[:, 0])
        assert float(s_late[row]) == pytest.approx(0.7 * total, rel=1e-4, abs=1e-4)


def test_padding_and_batch_mates_change_no_score(late_ce):
    ce = opened(late_ce)
    together = ce.score(QUERY, DOCS)
    alone = torch.stack([ce.score(QUERY, [doc])[0] for doc in DOCS])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)


def test_the_late_weight_and_projection_learn_from_zero(late_ce):
    late_ce.scorer.train()
    parts = late_ce.scorer.parts(**late_ce.tokenize_pairs(QUERY, DOCS))
    assert len(parts) == 3
    torch.nn.functional.cross_entropy(parts[2][None], torch.tensor([0])).backward()
    assert late_ce.scorer.late_weight.grad is not None and late_ce.scorer.late_weight.grad.abs() > 0
    assert {id(p) for p in late_ce.scorer.head_parameters()} >= {id(late_ce.scorer.late_weight),
                                                                  id(late_ce.scorer.proj.weight)}


def test_checkpoint_round_trip_keeps_gates_late_weight_and_projection(late_ce, tmp_path):
    ce = opened(late_ce)
    ce.scorer.classifier.save_pretrained(tmp_path)
    ce.tokenizer.save_pretrained(tmp_path)
    ce.scorer.save_head(tmp_path)
    assert read_head(tmp_path) == {"head": "gated+late", "dim": 32, "normalize": True}
    loaded = CrossEncoder.from_pretrained(tmp_path, lengths=PairLengths(64, 256))
    assert isinstance(loaded.scorer, GatedLateScorer)
    assert float(loaded.scorer.late_weight.detach()) == pytest.approx(0.7, rel=1e-3)
    torch.testing.assert_close(loaded.scorer.proj.weight, ce.scorer.proj.weight, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(loaded.score(QUERY, DOCS), ce.score(QUERY, DOCS), rtol=1e-2, atol=1e-2)
