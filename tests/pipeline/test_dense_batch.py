"""The first stage's vector search batched across requests (pipeline/dense_batch.py): each request gets the list a
search of its own gives, whatever it was batched with (other k, another index version); concurrent /search-like
calls through the Searcher agree with an unbatched Searcher; a stalled search runner ends the request (the bounded
wait of Searcher.awaited, tests/pipeline/test_encode_deadline.py), never holds its thread for good."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from sieve.pipeline.batching import BatchConfig, in_order
from sieve.pipeline.dense_batch import BLAS_MIN_BATCH, DenseSearch, DenseWant, encode_then_search, search_batch
from sieve.pipeline.errors import EncoderTimeout
from sieve.pipeline.searcher import Searcher, SearchParams
from tests.pipeline.stalled import Stalled

QUERIES = ["how do volcanoes erupt", "ocean tides and the moon", "history of the printing press",
           "photosynthesis in plants", "black holes", "the french revolution", "vaccines and immunity",
           "plate tectonics", "jazz music origins"]


def same_list(got: tuple, want: tuple) -> None:
    """Equal rows and scores; the matrix-product kernel may round a score in its last bit, so rows may trade places
    only where two scores are that close."""
    (scores, rows), (want_scores, want_rows) = got, want
    assert len(rows) == len(want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-5)
    close = np.zeros(len(rows), dtype=bool)
    gaps = np.abs(np.diff(want_scores)) < 1e-5
    close[:-1] |= gaps
    close[1:] |= gaps
    assert (rows[~close] == want_rows[~close]).all()


def test_each_item_of_a_batch_gets_its_own_search(biencoder, demo):
    vectors = biencoder.encode_queries(QUERIES).float().numpy()  # (9, d)
    ks = [5, 5, 20, 5, 20, 3, 5, 5, 20]
    items = [(demo, vectors[i], k) for i, k in enumerate(ks)]
    assert sum(k == 5 for k in ks) >= BLAS_MIN_BATCH  # one group large enough for FAISS's matrix-product kernel
    for (scores, rows, every), (index, vector, k) in zip(in_order(search_batch(items), len(items)), items):
        assert every is None  # FAISS's search: no row's score but the top k's
        want = index.search(vector[None, :], k)
        same_list((scores, rows), (want[0][0], want[1][0]))
        assert len(rows) == min(k, demo.size)


def test_items_of_two_index_versions_are_searched_each_in_its_own(biencoder, demo):
    class Other:  # another version: the same vectors, rows numbered backwards
        size = demo.size

        def search(self, queries, k):
            scores, rows = demo.search(queries, k)
            return scores, demo.size - 1 - rows

    other = Other()
    vectors = biencoder.encode_queries(QUERIES[:4]).float().numpy()
    out = in_order(search_batch([(demo, vectors[0], 5), (other, vectors[1], 5), (demo, vectors[2], 5), (other, vectors[3], 5)]), 4)
    for (scores, rows, _), index, vector in zip(out, [demo, other, demo, other], vectors):
        want = index.search(vector[None, :], 5)
        same_list((scores, rows), (want[0][0], want[1][0]))


def test_concurrent_searches_agree_with_unbatched_ones(biencoder, demo):
    batched = Searcher(biencoder, demo)
    alone = Searcher(biencoder, demo, batching=BatchConfig(enabled=False))
    try:
        params = [SearchParams(q, top_k=10, retrieve_k=30, rerank="none", retriever=r, use_cache=False)
                  for q in QUERIES for r in ("be", "hybrid")]
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(batched.search, params))
        for p, out in zip(params, got):
            want = alone.search(p).candidates
            assert out.candidates.rows.tolist() == want.rows.tolist(), p.query
        sizes = []
        batched.runners.on_batch = lambda name, n: sizes.append((name, n))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(batched.search, params))
        assert sizes and not any(name == "dense" for name, _ in sizes)  # every search rode with its query's encoding
        assert all(name.startswith("query:") for name, _ in sizes)
    finally:
        batched.close()
        alone.close()


def test_a_search_rides_with_the_encoding_unless_the_vector_was_cached(biencoder, demo):
    """The query encoder's runner searches the vector it has just made (one wait, not two); its time is "mips", not
    the encoder's. A vector from the embedding cache is searched by the vector-search runner, with the same result."""
    class Cache:
        def __init__(self):
            self.vectors = {}

        def get(self, tower, query):
            return self.vectors.get(query)

        def put(self, tower, query, vector):
            self.vectors[query] = vector

    searcher = Searcher(biencoder, demo, embedding_cache=Cache())
    try:
        batches = []
        searcher.runners.on_batch = lambda name, n: batches.append(name)
        params = SearchParams("volcano eruptions", top_k=10, retrieve_k=30, rerank="none", retriever="hybrid")
        fresh = searcher.search(params)
        assert not any(name == "dense" for name in batches)
        assert fresh.state.dense_hits is None  # taken by the stage that asked for it
        assert fresh.state.timings_ms["mips"] > 0 and "be_encode" in fresh.state.timings_ms
        batches.clear()
        cached = searcher.search(params)  # the vector from the cache: no encoding to ride with
        assert batches == ["dense"]
        assert cached.candidates.rows.tolist() == fresh.candidates.rows.tolist()
    finally:
        searcher.close()


def test_a_search_that_fails_in_the_encoders_batch_is_made_again_on_its_own(biencoder, demo):
    """A failing vector search does not fail the encoding it rode with: the vector comes back without candidates and
    the request searches again through the vector-search runner (whose error, if the failure stays, is its own)."""
    class FailsOnce:
        def __init__(self):
            self.calls = 0

        def __getattr__(self, name):  # everything else is the demo index's
            return getattr(demo, name)

        def search(self, queries, k):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("a passing fault")
            return demo.search(queries, k)

        def search_scored(self, queries, k):  # the batch's search (dense_batch.search_batch), with the same fault
            return (*self.search(queries, k), None)

    flaky = FailsOnce()
    vector = biencoder.encode_queries(["volcano"]).float().numpy()[0]
    out = encode_then_search(biencoder, [("volcano", DenseWant(flaky, 5)), "tides"])
    assert [len(item) for item in out] == [3, 3] and out[0][2] is None and out[1][2] is None  # vectors still answered
    np.testing.assert_allclose(out[0][0].float().numpy(), vector, atol=1e-5)
    searcher = Searcher(biencoder, demo)
    try:
        searcher.index = flaky
        flaky.calls = 0
        got = searcher.search(SearchParams("volcano", top_k=5, retrieve_k=5, cmc_k=5, rerank="none", retriever="be",
                                          use_cache=False))
        assert flaky.calls == 2 and got.candidates.rows.tolist() == demo.search(vector[None, :], 5)[1][0].tolist()
    finally:
        searcher.close()


def test_a_failing_version_fails_only_its_own_requests(biencoder, demo):
    class Closed:
        size = demo.size

        def search(self, queries, k):
            raise RuntimeError("this version is closed")

    vectors = biencoder.encode_queries(QUERIES[:3]).float().numpy()
    items = [(Closed(), vectors[0], 5), (demo, vectors[1], 5), (demo, vectors[2], 7)]
    answered = {}
    with pytest.raises(RuntimeError, match="closed"):  # raised after the other groups were answered
        for i, result in search_batch(items):
            answered[i] = result
    assert set(answered) == {1, 2}  # the batcher gives the error to item 0 only (pipeline/batching.py)
    for i in (1, 2):
        assert answered[i][1].tolist() == demo.search(items[i][1][None, :], items[i][2])[1][0].tolist()


class StalledRunners:
    """Runners whose dense runner never answers (a stuck search); the query encoder runs as usual."""

    def __init__(self, real):
        self.real, self.config, self.stalled = real, real.config, Stalled()

    def get(self, key, compute, max_wait_ms=None):
        return self.stalled if key == "dense" else self.real.get(key, compute, max_wait_ms)


def test_a_stalled_vector_search_ends_the_request(biencoder, demo):
    searcher = Searcher(biencoder, demo)
    stalled = StalledRunners(searcher.runners)
    searcher.options = searcher.options.__class__(searcher.options.batching, searcher.options.hybrid, {},
                                                  DenseSearch(stalled, searcher.awaited, with_encoding=False))
    try:
        started = time.monotonic()
        with pytest.raises(EncoderTimeout, match="vector search"):
            searcher.search(SearchParams("volcano", rerank="none", retriever="be", use_cache=False, timeout_ms=1))
        assert time.monotonic() - started < 1.0 + 5  # ENCODE_GRACE_S, polled every 0.1 s (slack for a busy host)
        assert stalled.stalled.futures and all(f.cancelled() for f in stalled.stalled.futures)
    finally:
        searcher.close()
