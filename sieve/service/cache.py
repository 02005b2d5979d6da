"""Query-embedding and /search result caches over one key-value store: Redis when SIEVE_REDIS_URL is set, else an
in-process LRU. Redis down or slow never fails a request: the call times out (SIEVE_REDIS_TIMEOUT_MS), is logged
and counted, the request is served uncached, and Redis is left alone for SIEVE_REDIS_RETRY_S before the next try.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict

import numpy as np
import torch

from sieve.service.metrics import Metrics

log = logging.getLogger("sieve.cache")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class LocalStore:
    """Bounded LRU with per-entry expiry, shared by the request threads."""

    def __init__(self, size: int):
        self.size = size
        self.entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self.lock:
            entry = self.entries.get(key)
            if entry is None or entry[0] < time.monotonic():
                self.entries.pop(key, None)
                return None
            self.entries.move_to_end(key)
            return entry[1]

    def set(self, key: str, value: bytes, ttl_s: int) -> None:
        with self.lock:
            self.entries[key] = (time.monotonic() + ttl_s, value)
            self.entries.move_to_end(key)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)


class RedisStore:
    """Redis with short timeouts and a breaker: after a failure, no call for `retry_s`."""

    def __init__(self, url: str, prefix: str, timeout_ms: int, retry_s: float, metrics: Metrics):
        import redis

        timeout = timeout_ms / 1000
        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                           retry_on_timeout=False)
        self.url_shown = url.split("@")[-1]  # never log a password in the URL
        self.prefix, self.retry_s, self.metrics = prefix, retry_s, metrics
        self.down_until = 0.0
        self.last_log = 0.0
        metrics.cache_errors.labels(op="skipped")  # exported at 0 while Redis is configured: the panel has a series

    def call(self, op: str, fn, default=None):
        if time.monotonic() < self.down_until:
            self.metrics.cache_errors.labels(op="skipped").inc()
            return default
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - any Redis failure means: go on without it
            self.failed(op, exc)
            return default
        self.metrics.redis_up.set(1)
        return result

    def failed(self, op: str, exc: Exception) -> None:
        self.down_until = time.monotonic() + self.retry_s
        self.metrics.redis_up.set(0)
        self.metrics.cache_errors.labels(op=op).inc()
        if time.monotonic() - self.last_log > 10:  # one line per 10 s, not one per request
            self.last_log = time.monotonic()
            log.warning("redis at %s failed on %s (%s: %s); serving without it for %.0f s",
                        self.url_shown, op, type(exc).__name__, exc, self.retry_s)

    def get(self, key: str) -> bytes | None:
        return self.call("get", lambda: self.client.get(self.prefix + key))

    def set(self, key: str, value: bytes, ttl_s: int) -> None:
        self.call("set", lambda: self.client.set(self.prefix + key, value, ex=ttl_s))

    def ping(self) -> bool:
        return bool(self.call("ping", self.client.ping, default=False))


class EmbeddingCache:
    """Query vectors per tower, keyed by tower identity, query max length and the normalised query."""

    def __init__(self, store, ttl_s: int, metrics: Metrics):
        self.store, self.ttl_s, self.metrics = store, ttl_s, metrics

    def key(self, tower, query: str) -> str:
        return f"emb:{tower.name}:{tower.weights_hash[:16]}:{tower.lengths.query_max_length}:{digest(query)}"

    def get(self, tower, query: str) -> torch.Tensor | None:
        raw = self.store.get(self.key(tower, query))
        if raw is None or len(raw) != 4 * tower.dim:
            self.metrics.cache.labels(cache="embedding", outcome="miss").inc()
            return None
        self.metrics.cache.labels(cache="embedding", outcome="hit").inc()
        return torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).to(tower.device)

    def put(self, tower, query: str, vector: torch.Tensor) -> None:
        data = vector.detach().float().cpu().numpy().astype(np.float32).tobytes()
        self.store.set(self.key(tower, query), data, self.ttl_s)


def index_identity(index) -> str:
    """What names an index's content: its version number and the hash of its documents (ids and texts). A number
    alone does not: two servers sharing Redis can each reach version 7 with different documents."""
    return index.identity()  # index/protocol.py: version + corpus hash locally, collection + write generation in Qdrant


class ResultCache:
    """Whole /search responses keyed by the index's identity + every parameter that changes the answer."""

    def __init__(self, store, ttl_s: int, metrics: Metrics):
        self.store, self.ttl_s, self.metrics = store, ttl_s, metrics

    @staticmethod
    def key(params: dict, index) -> str:
        return f"res:{index_identity(index)}:{digest(json.dumps(params, sort_keys=True, ensure_ascii=False))}"

    def get(self, key: str) -> dict | None:
        raw = self.store.get(key)
        outcome = "miss" if raw is None else "hit"
        self.metrics.cache.labels(cache="result", outcome=outcome).inc()
        return None if raw is None else json.loads(raw)

    def put(self, key: str, body: dict) -> None:
        self.put_json(key, json.dumps(body, ensure_ascii=False).encode("utf-8"))

    def put_json(self, key: str, raw: bytes) -> None:
        """A body already serialised as JSON (UTF-8)."""
        self.store.set(key, raw, self.ttl_s)


class Caches:
    def __init__(self, settings, metrics: Metrics):
        self.redis = None
        if settings.redis_url:
            self.redis = RedisStore(settings.redis_url, settings.redis_prefix, settings.redis_timeout_ms,
                                    settings.redis_retry_s, metrics)
            self.redis.ping()  # sets sieve_redis_up at start-up; a down Redis is logged, not fatal
        store = self.redis or LocalStore(settings.cache_size)
        self.enabled = settings.cache_enabled
        self.embeddings = EmbeddingCache(store, settings.cache_ttl_s, metrics) if self.enabled else None
        self.results = ResultCache(store, settings.cache_ttl_s, metrics) if self.enabled else None
        self.fingerprint = ""  # set once the models are loaded (service/app.py)
