"""annCUR offline indexing on the real index layout with a rank-6 fake cross-encoder at the model boundary (its
scores are a bilinear form, so annCUR must recover them exactly): build, load, search, resumable R_anc, reuse of
R_anc for other anchors, and clear refusals."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from sieve.index import IndexMismatchError
from sieve.research.anncur.index import AnnCURConfig, AnnCURIndex, build_anncur_index, pick_anchor_queries
from sieve.research.anncur.score_matrix import score_matrix
from sieve.index.search_index import SearchIndex
from tests.index.conftest import FakeEncoder


class FakeCrossEncoder:
    """score(q, d) = <phi(q), phi(d)> with 6-dimensional hashed bag-of-words vectors: a rank-6 score matrix."""

    def __init__(self, seed: int = 0, fail_after: int | None = None):
        self.tower = FakeEncoder(name="fake-ce", dim=6, seed=seed)
        self.name = "fake-ce"
        self.weights_hash = hashlib.sha256(f"fake-ce:{seed}".encode()).hexdigest()
        self.calls = 0
        self.fail_after = fail_after

    def score(self, query: str, documents):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated crash")
        self.calls += 1
        return self.tower.encode_documents(documents) @ self.tower.encode_documents([query])[0]  # (N,)


QUERIES = {f"q{i}": f"w{i} w{i + 7} w{3 * i % 400} w{(5 * i + 11) % 400}" for i in range(40)}


def test_exact_top_k_from_a_low_rank_cross_encoder(built, docs, tmp_path):
    ce = FakeCrossEncoder()
    manifest, record = build_anncur_index(built, ce, dict(list(QUERIES.items())[:20]), tmp_path / "anncur",
                                          AnnCURConfig(k_i=10, seed=1), progress=False)
    assert (manifest.dim, manifest.count, manifest.model_hash) == (10, len(docs), ce.weights_hash)
    assert manifest.corpus_hash == SearchIndex.load(built).manifest.corpus_hash
    assert record["k_q"] == 20 and len(record["anchor_rows"]) == 10 and record["r_anc"]["pairs"] == 20 * len(docs)
    assert record["anchor_query_fit_error"] < 1e-4
    anncur = AnnCURIndex.load(tmp_path / "anncur", model_hash=ce.weights_hash)
    texts = [d.full_text for d in docs]
    assert anncur.anchor_texts == [texts[r] for r in record["anchor_rows"]]
    for query in list(QUERIES.values())[20:]:  # queries never used as anchors
        exact = ce.score(query, texts)
        scores, rows = anncur.search(ce.score(query, anncur.anchor_texts), 10)
        assert rows.tolist() == np.argsort(-exact, kind="stable")[:10].tolist()
        np.testing.assert_allclose(scores, exact[rows], atol=1e-4)
    anncur.close()


def test_r_anc_resumes_after_an_interruption_and_is_reused_for_other_anchors(built, docs, tmp_path):
    queries = dict(list(QUERIES.items())[:12])
    out = tmp_path / "anncur"
    crashing = FakeCrossEncoder(fail_after=5)  # dies in the second chunk of 4 queries
    with pytest.raises(KeyboardInterrupt):
        build_anncur_index(built, crashing, queries, out, AnnCURConfig(k_i=8), progress=False)
    assert sorted(p.name for p in (out / "r_anc").glob("chunk_*.npy")) == ["chunk_00000.npy"]
    resumed = FakeCrossEncoder()
    _, record = build_anncur_index(built, resumed, queries, out, AnnCURConfig(k_i=8), progress=False)
    assert resumed.calls == 8  # only the two missing chunks
    assert record["r_anc"]["pairs_scored"] == 12 * len(docs)  # timing summed over both invocations
    reference, _ = score_matrix(FakeCrossEncoder(), list(queries.values()), [d.full_text for d in docs],
                                tmp_path / "fresh", progress=False)
    np.testing.assert_array_equal(np.load(out / "r_anc" / "chunk_00001.npy"), reference[4:8])
    again = FakeCrossEncoder()
    manifest, record = build_anncur_index(built, again, queries, out, AnnCURConfig(k_i=6, anchor_method="top"),
                                          progress=False)
    assert again.calls == 0 and manifest.version == 2 and manifest.dim == 6 and record["anchor_method"] == "top"


def test_refusals(built, tmp_path):
    queries = dict(list(QUERIES.items())[:8])
    out = tmp_path / "anncur"
    build_anncur_index(built, FakeCrossEncoder(), queries, out, AnnCURConfig(k_i=4), progress=False)
    with pytest.raises(ValueError, match="scores of other inputs .*cross_encoder"):
        build_anncur_index(built, FakeCrossEncoder(seed=5), queries, out, AnnCURConfig(k_i=4), progress=False)
    with pytest.raises(IndexMismatchError, match="model_hash"):
        AnnCURIndex.load(out, model_hash=FakeCrossEncoder(seed=5).weights_hash)
    with pytest.raises(ValueError, match="not an annCUR index"):
        AnnCURIndex.load(built)
    with pytest.raises(ValueError, match="k_i 9 must be in 1..min"):
        build_anncur_index(built, FakeCrossEncoder(), queries, tmp_path / "x", AnnCURConfig(k_i=9), progress=False)
    with pytest.raises(ValueError, match="unknown faiss kind"):
        build_anncur_index(built, FakeCrossEncoder(), queries, tmp_path / "x", AnnCURConfig(faiss_kind="lsh"))
    assert not (tmp_path / "x" / "r_anc").exists()  # refused before any scoring


def test_anchor_queries_are_a_seeded_sample_of_the_allowed_ids():
    a = pick_anchor_queries(QUERIES, 10, seed=3, only=[f"q{i}" for i in range(30)])
    assert len(a) == 10 and all(int(q[1:]) < 30 for q in a) and a == pick_anchor_queries(QUERIES, 10, seed=3, only=[f"q{i}" for i in range(30)])
    assert a != pick_anchor_queries(QUERIES, 10, seed=4, only=[f"q{i}" for i in range(30)])
    assert list(pick_anchor_queries(QUERIES, 100)) == sorted(QUERIES)  # fewer than k_q: all of them


class FakePartsCrossEncoder(FakeCrossEncoder):
    """A sum-of-parts cross-encoder: parts (rank-6 form, 2 x the same), score = their sum."""

    part_names = ("a", "b")

    def score_parts(self, query: str, documents):
        one = super().score(query, documents)
        return np.stack([one, 2 * one], axis=1)  # (N, 2)

    def score(self, query: str, documents):
        return self.score_parts(query, documents).sum(axis=1)


def test_parts_are_scored_once_and_cached_apart_from_the_sum(docs, tmp_path):
    ce, texts, queries = FakePartsCrossEncoder(), [d.full_text for d in docs], list(QUERIES.values())[:6]
    parts, timing = score_matrix(ce, queries, texts, tmp_path / "parts", progress=False, parts=True)
    assert parts.shape == (6, len(texts), 2) and timing["pairs"] == 6 * len(texts) and ce.calls == 6
    total, _ = score_matrix(ce, queries, texts, tmp_path / "sum", progress=False)
    np.testing.assert_allclose(parts.sum(axis=-1), total, rtol=1e-5)
    np.testing.assert_allclose(parts[..., 1], 2 * parts[..., 0], rtol=1e-5)
    again, timing = score_matrix(ce, queries, texts, tmp_path / "parts", progress=False, parts=True)
    assert ce.calls == 12 and timing["pairs"] == 6 * len(texts)  # 6 for the sum; the parts came from the cache
    np.testing.assert_array_equal(again, parts)
    with pytest.raises(ValueError, match="differing: parts"):  # a parts cache is not a sum cache
        score_matrix(ce, queries, texts, tmp_path / "parts", progress=False)
    with pytest.raises(ValueError, match="sum of parts"):
        score_matrix(FakeCrossEncoder(), queries, texts, tmp_path / "plain", progress=False, parts=True)
