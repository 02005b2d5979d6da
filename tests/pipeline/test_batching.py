"""Micro-batching gives the answers of one-by-one computation, and the batcher's own contract holds."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from sieve.models.cmc import randomize_gates
from sieve.models.cmc_checkpoint import untrained_cmc
from sieve.pipeline.batching import Batcher, BatchConfig, InFlight
from sieve.pipeline.packing import chunks_in_order, chunks_under_budget
from sieve.pipeline.searcher import SearchParams, Searcher
from sieve.pipeline.stages import CMCRerank, CrossEncoderRerank
from tests.fakes import tiny_cross_encoder

QUERIES = ["volcano lava eruption", "how to bake bread", "jazz improvisation", "telescopes and galaxies",
           "roman legions", "database transactions", "protein folding", "bicycle gears"]


def test_chunks_respect_the_budget_and_cover_everything():
    lengths = [5, 300, 40, 40, 41, 7, 512, 1]
    chunks = chunks_under_budget(lengths, budget=600)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    for chunk in chunks:
        assert len(chunk) == 1 or len(chunk) * max(lengths[i] for i in chunk) <= 600


def test_chunks_in_order_keep_the_order_and_the_budget():
    lengths, order = [5, 300, 40, 40, 41, 7, 512, 1], [7, 0, 5, 2, 3, 4, 1, 6]
    chunks = chunks_in_order(lengths, order, budget=600)
    assert [i for c in chunks for i in c] == order
    assert all(len(c) == 1 or len(c) * max(lengths[i] for i in c) <= 600 for c in chunks)


def test_batcher_answers_each_item_as_soon_as_compute_yields_it():
    gate = threading.Event()

    def compute_each(items):  # the second item is only finished once the test has seen the first answered
        yield 1, items[1] * 10
        assert gate.wait(5)
        yield 0, items[0] * 10

    batcher = Batcher("t", compute_each, max_size=2, max_wait_ms=200)
    first, second = batcher.submit(1), batcher.submit(2)
    assert second.result(5) == 20 and not first.done()
    gate.set()
    assert first.result(5) == 10
    batcher.close()


def test_batcher_gives_the_error_to_items_not_yet_answered():
    def compute_each(items):
        yield 0, "ok"
        raise ValueError("boom")

    batcher = Batcher("t", compute_each, max_size=2, max_wait_ms=200)
    done, failed = batcher.submit("a"), batcher.submit("b")
    assert done.result(5) == "ok"
    with pytest.raises(ValueError, match="boom"):
        failed.result(5)
    batcher.close()


def test_cross_encoder_answers_the_smaller_request_first_with_the_same_scores(biencoder):
    ce = tiny_cross_encoder(biencoder.tokenizer)
    stage = CrossEncoderRerank(ce, index=None, k=100, batch_tokens=64)  # several forward passes
    long_docs = [f"document number {i} about the history of bread, flour and yeast in Rome" for i in range(6)]
    items = [("bread", long_docs, None), ("stars", ["A telescope.", "Galaxies far away."], None), ("none", [], None)]
    answered = list(stage.compute_each(items))
    assert [i for i, _ in answered] == [2, 1, 0]  # empty first, then by tokens: the short request before the long
    for i, scores in answered:
        query, texts, _ = items[i]
        np.testing.assert_allclose(scores, ce.score(query, texts).numpy() if texts else [], rtol=1e-4, atol=1e-4)


def test_batcher_groups_concurrent_items_and_keeps_their_order():
    sizes = []
    gate = threading.Event()

    def compute(items):
        gate.wait(5)  # hold the first batch so the rest queue up behind it
        return [x * 10 for x in items]

    batcher = Batcher("t", compute, max_size=8, max_wait_ms=5, on_batch=lambda name, n: sizes.append(n))
    futures = [batcher.submit(i) for i in range(20)]
    gate.set()
    assert [f.result(5) for f in futures] == [i * 10 for i in range(20)]
    assert max(sizes) > 1 and sum(sizes) == 20 and all(n <= 8 for n in sizes)
    batcher.close()


def test_a_batch_waits_for_more_only_while_a_request_in_flight_is_not_in_it():
    """max_wait_ms is a minute: a request alone in flight is computed at once, two in flight are batched together
    and computed as soon as both are in, and a third request in flight (say, in another stage) makes the batch wait
    for it, up to max_wait_ms (here it comes)."""
    sizes, in_flight = [], InFlight()
    batcher = Batcher("t", lambda items: [x * 10 for x in items], max_size=8, max_wait_ms=60_000,
                      on_batch=lambda name, n: sizes.append(n), in_flight=lambda: in_flight.count)
    try:
        with in_flight:
            assert batcher.submit(1).result(30) == 10  # alone: no wait for company (it would take a minute)
        with in_flight, in_flight:
            first = batcher.submit(2)
            time.sleep(0.2)
            assert not first.done()  # the other request in flight may still send an item: the batch waits
            assert batcher.submit(3).result(30) == 30 and first.result(30) == 20  # both in: computed at once
        with in_flight, in_flight, in_flight:
            first, second = batcher.submit(4), batcher.submit(5)
            time.sleep(0.2)
            assert not first.done()
            third = batcher.submit(6)
            assert [f.result(30) for f in (first, second, third)] == [40, 50, 60]
        assert sizes == [1, 2, 3]
    finally:
        batcher.close()


def test_batcher_drops_cancelled_items_and_reports_errors_to_every_waiter():
    seen = []
    gate, started = threading.Event(), threading.Event()

    def compute(items):
        started.set()
        gate.wait(5)
        seen.extend(items)
        if "bad" in items:
            raise ValueError("boom")
        return items

    batcher = Batcher("t", compute, max_size=1, max_wait_ms=0)
    first = batcher.submit("first")
    assert started.wait(5)  # the worker holds "first": what follows queues behind it
    cancelled = batcher.submit("never")
    assert cancelled.cancel()
    bad = batcher.submit("bad")
    gate.set()
    assert first.result(5) == "first"
    with pytest.raises(ValueError, match="boom"):
        bad.result(5)
    assert "never" not in seen
    batcher.close()


def test_cmc_padded_batch_equals_one_query_at_a_time(biencoder):
    bundle = untrained_cmc(biencoder, share_query_tower=True)
    randomize_gates(bundle.model)
    stage = CMCRerank(bundle, index=None, batch_candidates=10_000)
    rng = np.random.default_rng(0)
    items = [(torch.from_numpy(rng.standard_normal(384).astype(np.float32)),
              rng.standard_normal((k, 384)).astype(np.float32), None) for k in (3, 50, 17, 64)]
    batched = stage.compute(items)
    for item, got in zip(items, batched):
        alone = stage.compute([item])[0]
        assert got.shape == (len(item[1]),)
        np.testing.assert_allclose(got, alone, rtol=1e-4, atol=1e-4)


def test_cross_encoder_pairs_of_many_queries_under_a_token_budget_equal_score(biencoder):
    ce = tiny_cross_encoder(biencoder.tokenizer)
    stage = CrossEncoderRerank(ce, index=None, k=100, batch_tokens=64)  # small budget: many forward passes
    items = [("bread baking", ["Knead the dough.", "Rome had many legions and roads.", "Yeast makes it rise."], None),
             ("stars", ["A telescope collects light from galaxies far away.", "Flour"], None)]
    for (query, texts, _), got in zip(items, stage.compute(items)):
        np.testing.assert_allclose(got, ce.score(query, texts).numpy(), rtol=1e-4, atol=1e-4)


def test_expired_items_are_not_computed(biencoder):
    stage = CrossEncoderRerank(tiny_cross_encoder(biencoder.tokenizer), index=None, k=10)
    fresh, stale = stage.compute([("q", ["a doc"], time.monotonic() + 60), ("q", ["a doc"], time.monotonic() - 1)])
    assert fresh is not None and stale is None


@pytest.mark.parametrize("enabled", [True, False])
def test_concurrent_search_equals_sequential(biencoder, demo, enabled):
    bundle = untrained_cmc(biencoder, share_query_tower=True)
    randomize_gates(bundle.model)  # a CMC that reorders, so equality is not trivial
    params = [SearchParams(q, top_k=10, retrieve_k=60, cmc_k=10) for q in QUERIES]
    reference = Searcher(biencoder, demo, bundle, batching=BatchConfig(enabled=False))
    expected = [reference.search(p) for p in params]
    reference.close()
    batch_sizes = []
    searcher = Searcher(biencoder, demo, bundle, batching=BatchConfig(enabled=enabled, max_wait_ms=20))
    searcher.runners.on_batch = lambda name, n: batch_sizes.append((name, n))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(searcher.search, params * 2))
    searcher.close()
    for want, have in zip(expected * 2, got):
        assert have.candidates.rows.tolist() == want.candidates.rows.tolist()
        np.testing.assert_allclose(have.candidates.scores["cmc"], want.candidates.scores["cmc"], atol=1e-4)
    if enabled:
        assert max(n for _, n in batch_sizes) > 1, batch_sizes  # 8 threads at once: some batch holds several
    else:
        assert {n for _, n in batch_sizes} == {1}


def test_after_a_shared_batch_a_lone_item_waits_for_the_company_that_comes_back():
    """Two requests that shared a batch finish together and come back together, the second counted a moment after
    the first reached the batcher: a batch holding fewer items than the last one waits for more (up to max_wait_ms),
    then goes as soon as it holds as many."""
    sizes, flight = [], [2]
    batcher = Batcher("t", lambda items: [x * 10 for x in items], max_size=8, max_wait_ms=60_000,
                      on_batch=lambda name, n: sizes.append(n), in_flight=lambda: flight[0])
    try:
        first = batcher.submit(1)
        assert batcher.submit(2).result(30) == 20 and first.result(30) == 10  # both in flight in: at once
        flight[0] = 1  # the second request is not counted yet
        again = batcher.submit(3)
        time.sleep(0.2)
        assert not again.done()  # the last batch had two: wait for the other
        assert batcher.submit(4).result(30) == 40 and again.result(30) == 30
        assert sizes == [2, 2]
    finally:
        batcher.close()


def test_a_server_that_counts_its_admitted_requests_has_the_batches_wait_for_them():
    """A request admitted by the server but not yet in the Searcher counts (the larger of the two counts)."""
    from sieve.pipeline.batching import Runners

    runners = Runners(BatchConfig())
    try:
        assert runners.requests_in_flight() == 0
        with runners.in_flight:
            assert runners.requests_in_flight() == 1
            runners.admitted = lambda: 3
            assert runners.requests_in_flight() == 3
            runners.admitted = lambda: 0  # a library caller beside the server's requests: still counted
            assert runners.requests_in_flight() == 1
    finally:
        runners.close()


def test_a_searcher_counts_its_requests_in_flight(biencoder, demo):
    """Searcher.search and .rerank hold the count the batchers read while they run, and release it when they fail;
    one request alone is not held back by the batch wait (a minute here)."""
    from sieve.pipeline.errors import RequestError
    from sieve.pipeline.searcher import RerankItem

    searcher = Searcher(biencoder, demo, untrained_cmc(biencoder, share_query_tower=True),
                        batching=BatchConfig(max_wait_ms=60_000))
    seen = []
    original = searcher.encode_query

    def spy(state, towers, dense=None):
        seen.append(searcher.runners.in_flight.count)
        return original(state, towers, dense)

    searcher.encode_query = spy
    try:
        assert len(searcher.search(SearchParams("volcano lava eruption", top_k=3, cmc_k=10)).candidates) == 3
        with pytest.raises(RequestError):
            searcher.search(SearchParams("   ", top_k=3))  # empty query: refused
        reranked = searcher.rerank("volcano", [RerankItem(text="lava flows"), RerankItem(text="bread")], "cmc", top_n=2)
        assert len(reranked.candidates) == 2
        assert seen == [1, 1] and searcher.runners.in_flight.count == 0
    finally:
        searcher.close()


def test_closing_the_runners_waits_for_their_threads_to_end():
    """Runners.close returns once every batch thread has ended (so none is still freeing its tensors while the
    interpreter shuts down, which aborted `sieve feedback import` once in 20 runs), and never waits past join_s."""
    from sieve.pipeline.batching import Runners

    runners = Runners(BatchConfig())
    fast = runners.get("fast", lambda items: [torch.ones(4) * i for i in items])
    assert float(fast.submit(2).result(10).sum()) == 8.0
    runners.close()
    assert not fast.thread.is_alive()

    stuck = Runners(BatchConfig())
    release = threading.Event()
    slow = stuck.get("slow", lambda items: [release.wait(30) for _ in items])
    future = slow.submit(1)
    started = time.monotonic()
    stuck.close(join_s=0.2)  # its thread is inside a compute: close gives up on it after join_s
    assert time.monotonic() - started < 5 and slow.thread.is_alive()
    release.set()
    assert future.result(10) is True
    slow.thread.join(10)
    assert not slow.thread.is_alive()
