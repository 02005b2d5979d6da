"""A request never waits for good on its query vector (Searcher.encoded): with a query batcher that never answers,
a /search-like call ends with EncoderTimeout once its deadline plus its timeout again has passed (at least
ENCODE_GRACE_S), or at once when its client has hung up; without a deadline (library use) it keeps waiting. The
service answers that with 503 `encoder_timeout` (tests/service/test_deadlines_http.py keeps the answered cases)."""
from __future__ import annotations

import threading
import time

import pytest

from sieve.pipeline.errors import EncoderTimeout
from sieve.pipeline.searcher import ENCODE_GRACE_S, Searcher, SearchParams
from tests.pipeline.stalled import Stalled


@pytest.fixture()
def stalled(biencoder, demo):
    searcher = Searcher(biencoder, demo)
    runner = Stalled()
    searcher.query_runner = lambda tower: runner
    yield searcher, runner
    searcher.close()


def test_a_stalled_encoder_ends_in_encoder_timeout_after_twice_the_timeout(stalled):
    searcher, runner = stalled
    started = time.monotonic()
    with pytest.raises(EncoderTimeout, match="deadline"):
        searcher.search(SearchParams("volcano", rerank="none", use_cache=False, timeout_ms=1500))
    took = time.monotonic() - started
    assert 3.0 <= took < 3.0 + 5  # the deadline (1.5 s) and as long again, polled every 0.1 s (slack for a busy host)
    assert runner.futures and all(f.cancelled() for f in runner.futures)


def test_a_short_timeout_still_gets_the_grace(stalled):
    searcher, _ = stalled
    started = time.monotonic()
    with pytest.raises(EncoderTimeout) as raised:
        searcher.search(SearchParams("volcano", rerank="none", use_cache=False, timeout_ms=1))
    assert not raised.value.client_gone  # the server's own delay: logged as an error
    assert ENCODE_GRACE_S <= time.monotonic() - started < ENCODE_GRACE_S + 5


def test_a_client_that_hung_up_stops_the_wait(stalled):
    searcher, _ = stalled
    gone = threading.Event()
    threading.Timer(0.3, gone.set).start()
    started = time.monotonic()
    with pytest.raises(EncoderTimeout, match="hung up") as raised:
        searcher.search(SearchParams("volcano", rerank="none", use_cache=False, timeout_ms=60_000, cancelled=gone))
    assert raised.value.client_gone  # logged at info by the server: not a server fault
    assert time.monotonic() - started < 5.0  # not the 120 s its deadline would allow


def test_without_a_deadline_the_vector_is_waited_for(stalled, biencoder):
    searcher, runner = stalled
    done: list = []
    worker = threading.Thread(target=lambda: done.append(searcher.search(SearchParams("volcano", rerank="none", use_cache=False))))
    worker.start()
    time.sleep(ENCODE_GRACE_S + 0.5)
    assert not done and runner.futures and not runner.futures[0].done()  # still waiting, past any grace
    runner.futures[0].set_result((*biencoder.encode_queries_counted(["volcano"])[0], None))  # (vector, token count,
    # no vector search done with it: the stage searches on its own)
    worker.join(10)
    assert done and len(done[0].candidates) > 0
