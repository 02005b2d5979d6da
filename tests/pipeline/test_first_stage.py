"""BM25 and hybrid first stages through the real Searcher over the demo index (packaged bi-encoder, real BM25)."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.index import SearchIndex, build_index, read_beir_corpus
from sieve.pipeline.errors import StageUnavailable
from sieve.pipeline.first_stage import HybridConfig, rrf_fuse
from sieve.pipeline.searcher import SearchParams, Searcher
from tests.conftest import DEMO_CORPUS

QUERY = "how do volcanoes erupt"


def test_rrf_is_the_weighted_sum_of_reciprocal_ranks():
    rows, scores = rrf_fuse([np.array([7, 3, 5]), np.array([3, 9])], [1.0, 2.0], k=10)
    expected = {7: 1 / 11, 3: 1 / 12 + 2 / 11, 5: 1 / 13, 9: 2 / 12}
    assert rows.tolist() == sorted(expected, key=lambda r: -expected[r])
    assert scores == pytest.approx([expected[r] for r in rows.tolist()])


def test_rrf_ties_keep_first_appearance():
    rows, _ = rrf_fuse([np.array([1, 2]), np.array([2, 1])], [1.0, 1.0])
    assert rows.tolist() == [1, 2]


def test_rrf_over_an_index_size_is_the_same_fusion():
    """The size path (sums in an array of the index's size) gives the rows, order, ties and float sums of the sort
    path, duplicates within a list included; rows outside [0, size) take the sort path."""
    rng = np.random.default_rng(3)
    for trial in range(200):
        size = int(rng.integers(5, 400))
        lists = [rng.integers(0, size, int(rng.integers(0, 60))) for _ in range(int(rng.integers(1, 4)))]
        if trial % 3 == 0:  # ranked lists without repeats, as the first stages give
            lists = [rng.permutation(size)[:int(rng.integers(1, size))] for _ in range(2)]
        weights = rng.uniform(0.1, 2.0, len(lists)).tolist()
        want_rows, want_scores = rrf_fuse(lists, weights, 7.0)
        rows, scores = rrf_fuse(lists, weights, 7.0, size=size)
        assert rows.tolist() == want_rows.tolist() and scores.tolist() == want_scores.tolist()
    rows, _ = rrf_fuse([np.array([1, 2]), np.array([2, 1])], [1.0, 1.0], size=3)
    assert rows.tolist() == [1, 2]
    rows, _ = rrf_fuse([np.array([-1, 4])], [1.0], size=3)  # outside the size: the sort path, as before
    assert rows.tolist() == [-1, 4]


def test_rrf_is_the_definition_bit_for_bit():
    """Against the definition in plain Python (float sums in list order, a stable sort by score descending):
    ties at equal ranks of disjoint lists, weights whose shares make equal sums one rounding apart, zero and
    negative weights, repeats within a list; with and without the index's size."""
    def reference(lists, weights, k):
        sums, first = {}, {}
        for rows, weight in zip(lists, weights):
            for rank, row in enumerate(rows.tolist(), 1):
                sums[row] = sums.get(row, 0.0) + weight / (k + rank)
                first.setdefault(row, len(first))
        rows = sorted(sums, key=lambda r: (-sums[r], first[r]))
        return rows, np.array([sums[r] for r in rows], dtype=np.float32)

    rng = np.random.default_rng(8)
    for trial in range(300):
        size = int(rng.integers(1, 700))
        perm = rng.permutation(size)
        kind = trial % 4
        if kind == 0:  # disjoint halves: a tie at every rank both reach
            lists = [perm[:size // 2], perm[size // 2:]]
        elif kind == 1:  # overlapping, as the first stages give
            lists = [perm[:int(rng.integers(0, size + 1))], rng.permutation(size)[:int(rng.integers(0, size + 1))]]
        elif kind == 2:
            lists = [perm, perm[::-1]]  # the same rows: every row's sum of two shares
        else:
            lists = [rng.integers(0, size, int(rng.integers(1, 80))) for _ in range(3)]  # repeats within a list
        weights = rng.choice([1.0, 0.3, 0.5, 2.0, 0.0, -1.0], len(lists)).tolist()
        k = float(rng.choice([60.0, 1.0, 7.5]))
        want_rows, want_scores = reference(lists, weights, k)
        for fused in (rrf_fuse(lists, weights, k), rrf_fuse(lists, weights, k, size=size)):
            assert fused[0].tolist() == want_rows, (trial, weights)
            assert fused[1].dtype == np.float32 and np.array_equal(fused[1].view(np.uint32),
                                                                    want_scores.view(np.uint32)), trial


def test_rrf_with_nan_sums_over_an_index_size_is_the_sort_path():
    """NaN sums come last, in order of first appearance, as the sort path puts them: k = -1 gives rank 1 an
    infinite share (with weights of both signs, a NaN sum); NaN weights of both signs give NaNs with other bits."""
    lists = [np.array([3, 1, 4, 2, 6]), np.array([3, 0, 2, 5, 4])]
    with np.errstate(divide="ignore", invalid="ignore"):
        for weights, k in (([1.0, -1.0], -1.0), ([-float("nan"), float("nan")], 60.0), ([float("nan"), 1.0], 60.0)):
            want_rows, want_scores = rrf_fuse(lists, weights, k)
            rows, scores = rrf_fuse(lists, weights, k, size=7)
            assert np.isnan(scores[-1]) and rows.tolist() == want_rows.tolist(), weights
            assert np.array_equal(scores, want_scores, equal_nan=True)


@pytest.fixture(scope="module")
def searcher(demo_index_dir, biencoder):
    with SearchIndex.load(demo_index_dir) as index:
        s = Searcher(biencoder, index, hybrid=HybridConfig(depth=20))
        yield s
        s.close()


def test_unset_retriever_is_hybrid_on_an_index_with_a_lexical_part(searcher):
    out = searcher.search(SearchParams(QUERY, top_k=5, retrieve_k=30, rerank="none"))
    assert out.state.ran == ["retrieve"] and {"be_encode", "mips", "bm25", "fuse"} <= set(out.state.timings_ms)
    assert set(out.candidates.scores) == {"retrieve", "be", "bm25"}


def test_hybrid_is_the_rrf_of_the_two_lists(searcher, biencoder):
    index = searcher.index
    be = searcher.search(SearchParams(QUERY, top_k=20, retrieve_k=20, rerank="none", retriever="be"))
    bm25 = searcher.search(SearchParams(QUERY, top_k=20, retrieve_k=20, rerank="none", retriever="bm25"))
    hybrid = searcher.search(SearchParams(QUERY, top_k=30, retrieve_k=30, rerank="none", retriever="hybrid"))
    rows, fused = rrf_fuse([be.candidates.rows, bm25.candidates.rows], [1.0, 1.0])
    assert hybrid.candidates.rows.tolist() == rows[:30].tolist()
    assert hybrid.candidates.scores["retrieve"] == pytest.approx(fused[:30])
    # every candidate carries both first-stage scores, also the ones a list did not contain
    vector = biencoder.encode_queries([QUERY])[0].numpy()
    expected_be = index.embeddings(hybrid.candidates.rows) @ vector
    assert hybrid.candidates.scores["be"] == pytest.approx(expected_be, abs=1e-4)
    assert hybrid.candidates.scores["bm25"] == pytest.approx(index.lexical_scores(QUERY)[hybrid.candidates.rows])
    assert "volcano" in " ".join(d.full_text.lower() for d in index.documents(hybrid.candidates.rows[:2]))


def test_bm25_alone_needs_no_query_vector(searcher):
    out = searcher.search(SearchParams(QUERY, top_k=3, retrieve_k=16, rerank="none", retriever="bm25"))
    assert "be_encode" not in out.state.timings_ms and "bm25" in out.state.timings_ms
    assert np.all(np.diff(out.candidates.scores["bm25"]) <= 0)


def test_bm25_with_no_matching_term_answers_empty(searcher):
    out = searcher.search(SearchParams("qwertyuiop zxcvbnm", top_k=3, retrieve_k=16, rerank="none",
                                       retriever="bm25"))
    assert len(out.candidates) == 0 and any("BM25 found nothing" in w for w in out.state.warnings)


def test_lexical_retrievers_are_refused_on_a_dense_only_index(tmp_path, biencoder, cache_dir):
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, tmp_path / "dense", cache_dir=cache_dir,
                progress=False, lexical=None)
    with SearchIndex.load(tmp_path / "dense") as index:
        s = Searcher(biencoder, index)
        try:
            assert s.search(SearchParams(QUERY, top_k=3, retrieve_k=16, rerank="none")).state.ran == ["retrieve"]
            assert "bm25" not in s.search(SearchParams(QUERY, retrieve_k=16, rerank="none")).state.timings_ms
            for retriever in ("bm25", "hybrid"):
                with pytest.raises(StageUnavailable, match="no lexical"):
                    s.search(SearchParams(QUERY, retrieve_k=16, rerank="none", retriever=retriever))
        finally:
            s.close()
