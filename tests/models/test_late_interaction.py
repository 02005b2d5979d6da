"""Cross-encoder + late interaction: sum-of-max against a loop reference, the query/document/padding masks, the
sum of the two heads, and the fp16 checkpoint round trip through the head registry."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from sieve.models.ce_heads import read_head
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.models.ce_heads import load_classifier, new_head
from sieve.research.heads.late_interaction import maxsim, segment_masks
from sieve.models.weights import default_model_path

DOCS = ["Lava is molten rock that erupts from volcanoes.", "Bread dough rises with yeast before baking.",
        "Penguins live in colonies on the Antarctic ice.", " ".join(["magma"] * 300)]


def loop_maxsim(q, q_mask, d, d_mask) -> torch.Tensor:
    """The definition, one pair and one token at a time."""
    out = []
    for b in range(q.shape[0]):
        total = 0.0
        docs = [d[b, j] for j in range(d.shape[1]) if d_mask[b, j]]
        for i in range(q.shape[1]):
            if q_mask[b, i] and docs:
                total += max(float(q[b, i] @ dj) for dj in docs)
        out.append(total)
    return torch.tensor(out)


def test_sum_of_max_matches_a_loop_reference_with_padding_masks():
    g = torch.Generator().manual_seed(0)
    q, d = torch.randn(5, 7, 16, generator=g), torch.randn(5, 11, 16, generator=g)
    q_mask, d_mask = torch.rand(5, 7, generator=g) > 0.3, torch.rand(5, 11, generator=g) > 0.4
    q_mask[0], d_mask[1] = False, False  # no query token; no document token: both score 0
    expected = loop_maxsim(q, q_mask, d, d_mask)
    got = maxsim(q, q_mask, d, d_mask)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert got[0] == 0 and got[1] == 0 and (got[2:] != 0).all()
    # masked positions may hold anything: huge values there change nothing
    q2, d2 = q.clone(), d.clone()
    q2[~q_mask], d2[~d_mask] = 1e6, 1e6
    torch.testing.assert_close(maxsim(q2, q_mask, d2, d_mask), got)


def new_late_ce(**options) -> CrossEncoder:
    """The packaged MiniLM with a fresh seeded cls+late head, as `sieve train ce --head cls+late` starts."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    scorer = new_head("cls+late", load_classifier(default_model_path()), tokenizer, options)
    return CrossEncoder(scorer.eval(), tokenizer, name="late-test", weights_hash="unsaved", lengths=PairLengths(16, 48))


@pytest.fixture(scope="module")
def late_ce() -> CrossEncoder:
    return new_late_ce()


def test_query_and_document_masks_cover_exactly_their_wordpieces(late_ce):
    tok = late_ce.tokenizer
    batch = late_ce.tokenize_pairs("what is lava", ["Lava is hot.", "Bread dough rises with yeast before baking."])
    q_mask, d_mask = segment_masks(batch["input_ids"], batch["attention_mask"], tok.sep_token_id)
    for row, qm, dm in zip(batch["input_ids"], q_mask, d_mask):
        words = tok.convert_ids_to_tokens(row)
        assert [w for w, m in zip(words, qm) if m] == tok.tokenize("what is lava")
        first_sep = words.index("[SEP]")
        expected_doc = [w for w in words[first_sep + 1:] if w not in ("[SEP]", "[PAD]")]
        assert [w for w, m in zip(words, dm) if m] == expected_doc
    assert not (q_mask & d_mask).any()
    assert (batch["attention_mask"][1] == 1).all() and (batch["attention_mask"][0] == 0).any()  # one row is padded
    # token_type_ids agree where they exist: document tokens are segment 1
    assert (batch["token_type_ids"][d_mask] == 1).all() and (batch["token_type_ids"][q_mask] == 0).all()


def test_score_is_the_sum_of_both_heads_and_padding_changes_nothing(late_ce):
    batch = late_ce.tokenize_pairs("what is lava", DOCS)
    with torch.no_grad():
        s_cls, s_late = late_ce.scorer.parts(**batch)
        total = late_ce.scorer(**batch)
        alone = [late_ce.scorer(**late_ce.tokenize_pairs("what is lava", [doc])) for doc in DOCS]
    torch.testing.assert_close(total, s_cls + s_late)
    torch.testing.assert_close(torch.cat(alone), total, rtol=1e-4, atol=1e-4)  # padded in a batch vs alone
    n_query_tokens = len(late_ce.tokenizer.tokenize("what is lava"))
    assert (s_late.abs() <= n_query_tokens + 1e-4).all()  # unit vectors: each max is a cosine
    assert (s_late > 0).all() and s_late.max() - s_late.min() > 0.05
    torch.testing.assert_close(late_ce.score("what is lava", DOCS), total, rtol=1e-4, atol=1e-4)


def test_without_projection_the_hidden_vectors_are_used(late_ce):
    ce = new_late_ce(dim=None)
    assert not any("proj" in name for name, _ in ce.scorer.named_parameters())
    batch = ce.tokenize_pairs("what is lava", DOCS[:2])
    with torch.no_grad():
        _, s_late = ce.scorer.eval().parts(**batch)
        hidden = ce.scorer.classifier(**batch, output_hidden_states=True).hidden_states[-1]
    vectors = torch.nn.functional.normalize(hidden, dim=-1)
    q_mask, d_mask = segment_masks(batch["input_ids"], batch["attention_mask"], ce.tokenizer.sep_token_id)
    torch.testing.assert_close(s_late, loop_maxsim(vectors, q_mask, vectors, d_mask), rtol=1e-4, atol=1e-4)


def test_fp16_checkpoint_round_trips_through_the_head_registry(late_ce, tmp_path):
    from sieve.training.ce_train import save_fp16

    save_fp16(late_ce, tmp_path)
    head = read_head(tmp_path)
    assert head == {"head": "cls+late", "dim": 128, "normalize": True, "query_max_length": 16, "max_length": 48}
    assert json.loads((tmp_path / "sieve_head.json").read_text())["head"] == "cls+late"
    loaded = CrossEncoder.from_pretrained(tmp_path, lengths=PairLengths(16, 48))
    assert type(loaded.scorer) is type(late_ce.scorer) and len(loaded.weights_hash) == 64
    expected, got = late_ce.score("what is lava", DOCS), loaded.score("what is lava", DOCS)
    torch.testing.assert_close(got, expected, rtol=0, atol=5e-3)
