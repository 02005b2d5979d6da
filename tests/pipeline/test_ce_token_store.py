"""The documents' cross-encoder token ids kept in the index (store "ce_tokens", models/ce_tokens.py): a /search with
the cross-encoder then tokenizes only its query. The stored ids must give the very tensors, hence the very scores,
that tokenizing the texts gives; new documents (writes) and merges must carry them; a cross-encoder that tokenizes
differently must not read them. The real shipped cross-encoder (gated head) and the packaged bi-encoder."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sieve.index import Document, SearchIndex, add_documents, build_index, compact, read_beir_corpus
from sieve.models import ce_tokens
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.stages import CrossEncoderRerank
from sieve.pipeline.state import Deadline, QueryState
from tests.conftest import DEMO_CORPUS

LONG = Document("long-1", "A long one", "the starter culture ferments the dough overnight " * 80)  # past max_length


@pytest.fixture(scope="module")
def shipped_ce():
    from sieve import checkpoints
    from sieve.models.ce_heads import trained_lengths
    from sieve.models.cross_encoder import CrossEncoder

    return CrossEncoder.from_pretrained(checkpoints.CROSS_ENCODER, lengths=trained_lengths(checkpoints.CROSS_ENCODER))


@pytest.fixture(scope="module")
def stored_dir(tmp_path_factory, biencoder, shipped_ce, cache_dir):
    path = tmp_path_factory.mktemp("ce-tokens-index")
    docs = [*read_beir_corpus(DEMO_CORPUS)[:30], LONG]
    build_index(docs, biencoder, path, cache_dir=cache_dir, progress=False,
                extra_stores={ce_tokens.STORE: ce_tokens.CETokenStore(shipped_ce)})
    return path


def state_for(query: str, rows: np.ndarray) -> QueryState:
    state = QueryState(query)
    state.deadline = Deadline(None, None)
    state.candidates = Candidates(rows=rows, scores={"retrieve": -np.arange(len(rows), dtype=np.float32)})
    return state


def test_stored_ids_give_the_tensors_of_the_texts(stored_dir, shipped_ce):
    with SearchIndex.load(stored_dir) as index:
        rows = np.arange(index.size)
        texts = [d.full_text for d in index.documents(rows)]
        ids = ce_tokens.unpack(index.embeddings(rows, store=ce_tokens.STORE))
        assert max(len(i) for i in ids) == shipped_ce.lengths.max_length  # the long document is cut as the text path cuts it
        query = "how long does sourdough ferment"
        q_ids = ce_tokens.query_ids(shipped_ce.tokenizer, [query], shipped_ce.lengths.query_max_length)
        from_ids = shipped_ce.pairs_from_ids(q_ids * len(ids), ids)
        from_texts = shipped_ce.tokenize_pairs(query, texts)
        assert from_ids.keys() == from_texts.keys()
        for key in from_texts:
            assert torch.equal(from_ids[key], from_texts[key]), key


def text_path(ce, index, k: int) -> CrossEncoderRerank:
    """The stage as every request ran it before the store: texts, tokenized as text pairs in the batcher."""
    stage = CrossEncoderRerank(ce, index, k)
    stage.by_ids = stage.stored = False
    return stage


def counted_texts(monkeypatch) -> list:
    """The documents handed to the tokenizer from now on."""
    tokenized = []
    real = ce_tokens.document_ids
    monkeypatch.setattr(ce_tokens, "document_ids", lambda tok, docs, n: tokenized.extend(docs) or real(tok, docs, n))
    return tokenized


def assert_same_batches(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


def test_texts_are_tokenized_only_as_far_as_their_pair_reads(shipped_ce, monkeypatch):
    """A text's pair keeps max_length - query - 4 of its document's tokens (GatedScorer.doc_budget): the text is read
    only that far, and the tensors are those of its whole max_length ids."""
    query, long = "how long does sourdough ferment", LONG.full_text
    q_ids = ce_tokens.query_ids(shipped_ce.tokenizer, [query], shipped_ce.lengths.query_max_length)
    room = shipped_ce.document_room(q_ids)
    assert room == [shipped_ce.lengths.max_length - len(q_ids[0]) - 4]
    whole = shipped_ce.pairs_from_ids(q_ids, ce_tokens.document_ids(shipped_ce.tokenizer, [long],
                                                                     shipped_ce.lengths.max_length))
    assert whole["attention_mask"].sum().item() == shipped_ce.lengths.max_length  # the document fills the pair
    read = []
    real = ce_tokens.unlocked

    def recording(tokenizer):
        backend = real(tokenizer)
        return SimpleNamespace(encode_batch=lambda texts, **kw: read.extend(map(len, texts)) or
                               backend.encode_batch(texts, **kw))

    monkeypatch.setattr(ce_tokens, "unlocked", recording)
    got = shipped_ce.tokenize_pairs(query, [long])
    assert max(read) == room[0] * ce_tokens.FIRST_CHARS_PER_TOKEN < len(long)
    for key in whole:
        assert torch.equal(got[key], whole[key]), key


def test_the_stage_reads_ids_and_scores_exactly_as_from_texts(stored_dir, shipped_ce, monkeypatch):
    with SearchIndex.load(stored_dir) as index:
        stored, texts = CrossEncoderRerank(shipped_ce, index, 8), text_path(shipped_ce, index, 8)
        unstored = CrossEncoderRerank(shipped_ce, index, 8)
        unstored.stored = False  # an index without the store: texts, tokenized in one call per batch
        assert stored.stored and stored.by_ids
        queries = ["how long does sourdough ferment", "volcano eruption", "a query about nothing in particular"]
        rows = [np.array([30, 3, 7, 1, 12, 0, 5, 9]), np.array([2, 4, 6]), np.array([11, 30])]
        tokenized = counted_texts(monkeypatch)
        by_ids = [stored.prepare(state_for(q, r)) for q, r in zip(queries, rows)]
        by_texts = [texts.prepare(state_for(q, r)) for q, r in zip(queries, rows)]
        assert all(isinstance(d, list) for item in by_ids for d in item[1])  # stored ids, read in prepare
        assert all(isinstance(d, str) for item in by_texts for d in item[1])
        from_ids = stored.pair_batch(by_ids)
        assert tokenized == []  # every document read as its stored ids
        expected_batch, expected = texts.pair_batch(by_texts), texts.compute(by_texts)
        mixed = [by_ids[0], by_texts[1], by_ids[2]]  # a texts item from a stage sharing the batcher (annCUR)
        assert_same_batches(from_ids, expected_batch)
        assert_same_batches(stored.pair_batch(mixed), expected_batch)
        assert_same_batches(unstored.pair_batch(by_texts), expected_batch)
        for got in (stored.compute(by_ids), stored.compute(mixed), unstored.compute(by_texts)):
            for g, e in zip(got, expected):
                np.testing.assert_array_equal(g, e)


def test_a_rerank_of_indexed_ids_reads_their_stored_ids(stored_dir, shipped_ce, monkeypatch):
    """/rerank items that name indexed documents (an id alone, or an id with the indexed text) keep their rows, so
    their stored ids are read; a text of its own (or an id whose text differs) is tokenized; scores as from texts."""
    from sieve.pipeline.registry import RerankContext
    from sieve.pipeline.rerank_inputs import RerankItem, resolve_texts
    from sieve.stages.ce import texts_reranker

    with SearchIndex.load(stored_dir) as index:
        indexed = index.documents(np.array([3, 30, 7]))
        items = [RerankItem(id=indexed[0].id), RerankItem(text="lava flows downhill"),
                 RerankItem(id=indexed[1].id, text=indexed[1].full_text), RerankItem(id=indexed[2].id, text="not it")]
        texts = resolve_texts(index, items)
        state = state_for("volcano", np.empty(0, dtype=np.int64))
        ctx = RerankContext(state, items, texts, index, shipped_ce, None, SimpleNamespace(
            batching=SimpleNamespace(ce_tokens=8192)), None, lambda towers: None)
        stage, = texts_reranker()(ctx)
        np.testing.assert_array_equal(state.candidates.rows, [3, -1, 30, -1])
        tokenized = counted_texts(monkeypatch)
        got = stage.compute([stage.prepare(state)])[0]
        assert tokenized == ["lava flows downhill", "not it"]
        reference = text_path(shipped_ce, index, 4)
        expected = reference.compute([reference.prepare(state)])[0]
        np.testing.assert_array_equal(got, expected)


def test_writes_and_merges_carry_the_ids(tmp_path, stored_dir, biencoder, shipped_ce):
    import shutil

    shutil.copytree(stored_dir, tmp_path / "index")
    store = ce_tokens.CETokenStore(shipped_ce)
    new = [Document("new-1", "Bread", "Knead the dough, then let it rise."), Document("new-2", "", "Lava flows downhill.")]
    add_documents(tmp_path / "index", new, {"primary": biencoder, ce_tokens.STORE: store})
    compact(tmp_path / "index")
    with SearchIndex.load(tmp_path / "index") as index:
        rows = index.rows_for_ids(["new-1", "new-2", "long-1"])
        texts = [d.full_text for d in index.documents(rows)]
        expected = ce_tokens.document_ids(shipped_ce.tokenizer, texts, shipped_ce.lengths.max_length)
        assert ce_tokens.unpack(index.embeddings(rows, store=ce_tokens.STORE)) == expected


def test_a_cross_encoder_that_tokenizes_differently_reads_the_texts(stored_dir, shipped_ce):
    import copy

    from sieve.models.cross_encoder import PairLengths

    other = copy.copy(shipped_ce)
    other.lengths = PairLengths(shipped_ce.lengths.query_max_length, shipped_ce.lengths.max_length // 2)
    with SearchIndex.load(stored_dir) as index:
        assert ce_tokens.stored_for(shipped_ce, index)
        assert not ce_tokens.stored_for(other, index)
        stage = CrossEncoderRerank(other, index, 4)
        assert not stage.stored


def test_a_head_without_its_own_pair_layout_has_no_store(ce_checkpoint):
    from sieve.models.cross_encoder import CrossEncoder

    plain = CrossEncoder.from_pretrained(ce_checkpoint)  # "cls": the tokenizer lays out the text pair
    assert not ce_tokens.supports(plain)
    with pytest.raises(ValueError, match="text pairs"):
        ce_tokens.CETokenStore(plain)


def test_pack_refuses_what_float32_cannot_hold():
    with pytest.raises(ValueError):
        ce_tokens.pack([[1, 2, ce_tokens.EXACT_BELOW]], 4)
    assert ce_tokens.unpack(ce_tokens.pack([[5, 0, 7], []], 4)) == [[5, 0, 7], []]
