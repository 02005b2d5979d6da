"""The cross-encoder's pair inputs on the installed transformers (5.x: no prepare_for_model) equal the BERT layout
built by hand from separately tokenized ids: `[CLS] q [SEP] d [SEP]`, the query cut to its own budget, the document
cut so the pair fits, token types 0 then 1."""
from __future__ import annotations

import torch

from sieve.models.ce_base import PairLengths
from tests.fakes import packaged_tokenizer, tiny_cross_encoder


def by_hand(tokenizer, query: str, document: str, lengths: PairLengths) -> tuple[list[int], list[int]]:
    q = tokenizer(query, add_special_tokens=False)["input_ids"][:lengths.query_max_length]
    d = tokenizer(document, add_special_tokens=False)["input_ids"]
    d = d[:lengths.max_length - len(q) - 3]
    ids = [tokenizer.cls_token_id, *q, tokenizer.sep_token_id, *d, tokenizer.sep_token_id]
    return ids, [0] * (len(q) + 2) + [1] * (len(d) + 1)


def test_pairs_follow_the_bert_layout_with_each_part_cut_to_its_budget():
    tokenizer = packaged_tokenizer()
    model = tiny_cross_encoder(tokenizer)
    model.lengths = PairLengths(query_max_length=8, max_length=32)
    query = "how do volcanoes erupt when magma rises through the crust of the earth"  # > 8 tokens: cut
    documents = ["Lava flows.", "Magma chambers under volcanoes fill until the pressure breaks the rock above, "
                 "and the eruption follows within days or weeks of the first tremors."]  # > 32 with the query: cut
    batch = model.tokenize_pairs(query, documents)
    for row, document in enumerate(documents):
        ids, types = by_hand(tokenizer, query, document, model.lengths)
        width = len(ids)
        assert batch["input_ids"][row, :width].tolist() == ids, tokenizer.decode(batch["input_ids"][row])
        assert batch["token_type_ids"][row, :width].tolist() == types
        assert batch["attention_mask"][row].sum().item() == width
    assert batch["input_ids"].shape[1] == model.lengths.max_length  # the long document filled the pair
    assert torch.isfinite(model.score(query, documents)).all()
