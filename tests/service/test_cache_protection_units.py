"""The cache stores, the breaker, the rate limiter and the key check on their own (no model, no server): against
the machine's Redis under a prefix of our own, an unreachable Redis, and in-process."""
from __future__ import annotations

import time

import pytest

from sieve.service.cache import LocalStore, RedisStore
from sieve.service.metrics import Metrics
from sieve.service.protection import Authenticator, RateLimited, RateLimiter, Unauthorized, key_id
from tests.server import free_port
from tests.service.conftest import REDIS_URL, redis_or_skip


def test_local_store_is_a_bounded_lru_with_expiry():
    store = LocalStore(size=2)
    store.set("a", b"1", ttl_s=60)
    store.set("b", b"2", ttl_s=60)
    assert store.get("a") == b"1"  # a is now the most recent
    store.set("c", b"3", ttl_s=60)
    assert store.get("b") is None and store.get("a") == b"1" and store.get("c") == b"3"
    store.entries["a"] = (time.monotonic() - 1, b"1")  # expired
    assert store.get("a") is None


def test_redis_store_round_trip_under_its_prefix(redis_prefix):
    redis = redis_or_skip()
    metrics = Metrics()
    store = RedisStore(REDIS_URL, redis_prefix + "unit:", timeout_ms=200, retry_s=5, metrics=metrics)
    store.set("k", b"value", ttl_s=30)
    assert store.get("k") == b"value" and redis.get(f"{redis_prefix}unit:k") == b"value"
    assert 0 < redis.ttl(f"{redis_prefix}unit:k") <= 30
    assert metrics.redis_up._value.get() == 1


def test_unreachable_redis_is_fast_counted_and_then_left_alone():
    metrics = Metrics()
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:", timeout_ms=50, retry_s=60, metrics=metrics)
    started = time.perf_counter()
    assert store.get("k") is None
    store.set("k", b"v", ttl_s=1)  # inside the breaker window: not even tried
    assert time.perf_counter() - started < 1.0
    assert metrics.cache_errors.labels(op="get")._value.get() == 1
    assert metrics.cache_errors.labels(op="skipped")._value.get() == 1
    assert metrics.redis_up._value.get() == 0


class SteppedClock:
    """A clock the test moves: the limiter's arithmetic is checked without sleeping or racing the real one."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_in_process_refills_at_its_rate():
    clock = SteppedClock()
    local = RateLimiter(rate=2, burst=2, clock=clock)
    local.check("k")
    local.check("k")
    with pytest.raises(RateLimited) as info:
        local.check("k")
    assert info.value.status_code == 429 and info.value.headers["Retry-After"] == "1"
    assert "retry in 0.50 s" in info.value.detail
    local.check("other")  # buckets are per caller
    clock.now += 0.25  # (binary-exact steps)
    with pytest.raises(RateLimited):
        local.check("k")  # half a token
    clock.now += 0.25
    local.check("k")  # 0.5 s at 2/s: one token back
    clock.now += 3600
    local.check("k")
    local.check("k")  # refilled, but never past the burst
    with pytest.raises(RateLimited):
        local.check("k")


def test_rate_limiter_in_redis_with_a_local_fallback(redis_prefix):
    """Rates of one token per 100 s: no refill can happen while the test runs, however slow the machine."""
    redis_or_skip()
    shared_store = RedisStore(REDIS_URL, redis_prefix + "unit-rl:", timeout_ms=200, retry_s=5, metrics=Metrics())
    one, two = RateLimiter(0.01, 2, shared_store), RateLimiter(0.01, 2, shared_store)  # two replicas, one bucket
    one.check("caller")
    two.check("caller")
    with pytest.raises(RateLimited) as info:
        one.check("caller")
    assert 99 <= int(info.value.headers["Retry-After"]) <= 100

    down = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:", timeout_ms=50, retry_s=60, metrics=Metrics())
    fallback = RateLimiter(0.01, 1, down)
    fallback.check("c")  # Redis unreachable: the local bucket decides, nothing fails
    with pytest.raises(RateLimited):
        fallback.check("c")


def test_api_keys_are_compared_with_hmac_compare_digest_and_named_by_id(monkeypatch):
    """No timing is measured (too noisy for CI): the check is that every key comparison goes through
    hmac.compare_digest, the constant-time comparison, and that callers are named by a key id, not the key."""
    import hmac

    import sieve.service.protection

    compared, compare_digest = [], hmac.compare_digest

    def spy(a, b):
        compared.append(a)
        return compare_digest(a, b)

    monkeypatch.setattr(sieve.service.protection.hmac, "compare_digest", spy)
    auth = Authenticator({"secret-one", "secret-two"})
    assert auth.identify("Bearer secret-two") == key_id("secret-two") != "secret-two"
    assert compared and set(compared) == {b"secret-two"}
    with pytest.raises(Unauthorized):
        auth.identify("Bearer wrong")
    assert compared.count(b"wrong") == 2  # compared against every key, each in constant time
    for header in (None, "", "Bearer", "Bearer wrong", "Basic secret-one", "secret-one"):
        with pytest.raises(Unauthorized):
            auth.identify(header)
    assert Authenticator(set()).identify(None) is None  # no keys configured: open
