"""Cross-encoder head "gated": with its gates closed it scores exactly the bi-encoder's cosine (x scale); opening a
gate lets the document's states depend on the query; gates get a gradient at 0; padding and batch-mates change no
score; the fp16 checkpoint round trip keeps the gates."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from sieve.models.ce_gated import GatedScorer, segment_positions
from sieve.models.ce_heads import load_classifier, new_head, read_head
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.models.weights import default_model_path

QUERY = "how do volcanoes erupt"
DOCS = ["Lava is molten rock that erupts from volcanoes when magma pressure builds.",
        "Bread dough rises with yeast before baking.", "Penguins live in colonies on the Antarctic ice, " * 6]


@pytest.fixture()
def gated_ce() -> CrossEncoder:
    torch.manual_seed(0)
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    scorer = new_head("gated", load_classifier(path), tokenizer)
    return CrossEncoder(scorer, tokenizer, name="gated", weights_hash="unsaved", lengths=PairLengths(64, 256))


def doc_mean(ce: CrossEncoder, query: str, doc: str) -> torch.Tensor:
    batch = ce.tokenize_pairs(query, [doc])
    with torch.no_grad():
        states = ce.scorer.states(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    return states[0][batch["token_type_ids"][0] == 1].mean(0)


def test_segment_positions_restart_at_the_document():
    segments = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
    assert segment_positions(segments, mask).tolist() == [[0, 1, 2, 0, 1, 2, 3], [0, 1, 0, 1, 4, 5, 6]]


def test_pair_layout_is_two_bi_encoder_inputs_side_by_side(gated_ce):
    tok = gated_ce.tokenizer
    batch = gated_ce.tokenize_pairs(QUERY, DOCS[:2])
    ids, segments = batch["input_ids"][1], batch["token_type_ids"][1]
    real = batch["attention_mask"][1].bool()
    expected = tok(QUERY)["input_ids"] + tok(DOCS[1])["input_ids"]  # [CLS] q [SEP] + [CLS] d [SEP]
    assert ids[real].tolist() == expected
    assert segments[real].tolist() == [0] * len(tok(QUERY)["input_ids"]) + [1] * len(tok(DOCS[1])["input_ids"])


def test_closed_gates_score_exactly_the_bi_encoder_cosine(gated_ce, biencoder):
    scores = gated_ce.score(QUERY, DOCS)
    q = biencoder.encode_queries([QUERY]).float()
    d = torch.from_numpy(biencoder.encode_documents(DOCS, progress=False))
    torch.testing.assert_close(scores, 20.0 * (q @ d.T)[0], rtol=1e-4, atol=1e-4)


def test_closed_gates_keep_the_document_blind_to_the_query_and_open_ones_do_not(gated_ce):
    other = "recipes for sourdough bread"
    torch.testing.assert_close(doc_mean(gated_ce, QUERY, DOCS[0]), doc_mean(gated_ce, other, DOCS[0]))
    with torch.no_grad():
        gated_ce.scorer.gates[2, 5] = 1.0  # one head of one layer opened
    assert not torch.allclose(doc_mean(gated_ce, QUERY, DOCS[0]), doc_mean(gated_ce, other, DOCS[0]), atol=1e-4)


def test_closed_gates_receive_a_gradient(gated_ce):
    gated_ce.scorer.train()
    batch = gated_ce.tokenize_pairs(QUERY, DOCS)
    logits = gated_ce.scorer(**batch)
    torch.nn.functional.cross_entropy(logits[None], torch.tensor([0])).backward()
    assert gated_ce.scorer.gates.grad is not None and gated_ce.scorer.gates.grad.abs().sum() > 0
    assert gated_ce.scorer.classifier.classifier.weight.grad.abs().sum() > 0  # the [CLS] logit learns from 0 too


def test_padding_and_batch_mates_change_no_score(gated_ce):
    with torch.no_grad():
        gated_ce.scorer.gates.fill_(0.5)
    together = gated_ce.score(QUERY, DOCS)  # padded to the longest document
    alone = torch.stack([gated_ce.score(QUERY, [doc])[0] for doc in DOCS])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)


def test_checkpoint_round_trip_keeps_gates_and_scale(gated_ce, tmp_path):
    with torch.no_grad():
        gated_ce.scorer.gates.uniform_(-1, 1)
        gated_ce.scorer.scale.fill_(18.0)
    gated_ce.scorer.classifier.save_pretrained(tmp_path)
    gated_ce.tokenizer.save_pretrained(tmp_path)
    gated_ce.scorer.save_head(tmp_path)
    assert read_head(tmp_path) == {"head": "gated"}
    loaded = CrossEncoder.from_pretrained(tmp_path, lengths=PairLengths(64, 256))
    assert isinstance(loaded.scorer, GatedScorer)
    torch.testing.assert_close(loaded.scorer.gates, gated_ce.scorer.gates, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(loaded.score(QUERY, DOCS), gated_ce.score(QUERY, DOCS), rtol=1e-2, atol=1e-2)


def test_parts_are_scored_in_one_pass_each_as_its_own_loss_sees_it(gated_ce):
    with torch.no_grad():
        gated_ce.scorer.gates.fill_(0.5)
        gated_ce.scorer.classifier.classifier.weight.normal_(0, 0.1)  # a live [CLS] logit, not the fresh zero
    parts = gated_ce.score_parts(QUERY, DOCS)
    assert gated_ce.part_names == ("cls", "cos") and parts.shape == (3, 2)
    torch.testing.assert_close(parts.sum(dim=1), gated_ce.score(QUERY, DOCS), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        s_cls, s_cos = gated_ce.scorer.parts(**gated_ce.tokenize_pairs(QUERY, DOCS))
    torch.testing.assert_close(parts, torch.stack([s_cls, s_cos], dim=1), rtol=1e-4, atol=1e-4)
    assert parts[:, 0].abs().min() > 0 and parts[:, 1].std() > 0


def test_score_caches_record_the_head_they_were_scored_with(gated_ce):
    from sieve.research.anncur.score_matrix import scorer_identity

    assert scorer_identity(gated_ce)["head"] == "gated"  # not "cls": the gated module builds its spec
