"""Query-embedding and result caches: the in-process LRU by default, the real Redis when configured; a new index
version never serves an older result."""
from __future__ import annotations

import re

from tests.service.conftest import auth, redis_or_skip


def counter(metrics: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", metrics, re.M)
    return float(match.group(1)) if match else 0.0


def test_second_identical_search_is_a_cache_hit_with_the_same_answer(client):
    body = {"query": "  How   do volcanoes   erupt? ", "top_k": 4}
    first = client.post("/search", json=body).json()
    before = client.get("/metrics").text
    second = client.post("/search", json={**body, "query": "How do volcanoes erupt?"}).json()  # same, normalised
    after = client.get("/metrics").text
    assert not first["cached"] and second["cached"]
    assert second["results"] == first["results"] and second["index_version"] == first["index_version"]
    assert second["timings_ms"].get("be_encode") is None and second["timings_ms"]["total"] >= 0
    assert second["request_id"] and second["request_id"] != first["request_id"]  # the stored answer's own is not served
    assert counter(after, "sieve_cache_requests_total", cache="result", outcome="hit") == \
        counter(before, "sieve_cache_requests_total", cache="result", outcome="hit") + 1


def test_no_cache_header_computes_afresh_with_every_stage_timed(client):
    body = {"query": "tides and the moon", "top_k": 4}
    first = client.post("/search", json=body).json()
    before = client.get("/metrics").text
    fresh = client.post("/search", json=body, headers={"Cache-Control": "no-cache"}).json()
    after = client.get("/metrics").text
    assert not fresh["cached"] and fresh["results"] == first["results"]
    assert fresh["timings_ms"].get("be_encode") is not None and fresh["timings_ms"].get("mips") is not None
    for cache in ("result", "embedding"):  # neither cache was even asked
        assert counter(after, "sieve_cache_requests_total", cache=cache, outcome="hit") == \
            counter(before, "sieve_cache_requests_total", cache=cache, outcome="hit")
    assert client.post("/search", json=body).json()["cached"]  # without the header the stored answer serves again


def test_timeout_does_not_split_the_cache_but_other_parameters_do(client):
    base = {"query": "sourdough starter feeding", "top_k": 3}
    client.post("/search", json=base)
    assert client.post("/search", json={**base, "timeout_ms": 60_000}).json()["cached"]
    assert not client.post("/search", json={**base, "rerank": "none"}).json()["cached"]


def test_redis_holds_embeddings_and_results_under_the_prefix_with_a_ttl(guarded_server, redis_prefix, fresh_key):
    redis = redis_or_skip()
    KEY = auth(fresh_key())
    with guarded_server.client() as client:
        body = {"query": "river deltas and sediment", "top_k": 3}
        first = client.post("/search", json=body, headers=KEY)
        assert first.status_code == 200, first.text
        second = client.post("/search", json=body, headers=KEY).json()
        assert second["cached"] and second["results"] == first.json()["results"]
        metrics = client.get("/metrics").text
    keys = [k.decode() for k in redis.scan_iter(match=f"{redis_prefix}*")]
    assert any(k.startswith(f"{redis_prefix}emb:") for k in keys), keys
    result_keys = [k for k in keys if k.startswith(f"{redis_prefix}res:v{first.json()['index_version']}:")]
    assert result_keys and all(0 < redis.ttl(k) <= 3600 for k in result_keys)
    assert "sieve_redis_up 1.0" in metrics


def test_a_new_index_version_never_serves_an_older_result(guarded_server, fresh_key):
    KEY = auth(fresh_key())  # a bucket of its own: 4 requests within the burst of 5, whatever ran before
    with guarded_server.client() as client:
        body = {"query": "glaciers carving fjords", "top_k": 5, "return_documents": True}
        before = client.post("/search", json=body, headers=KEY).json()
        assert client.post("/search", json=body, headers=KEY).json()["cached"]
        doc = {"id": "glacier-new", "title": "Glaciers carving fjords", "text": "Glaciers carving fjords into rock."}
        written = client.post("/documents", json={"documents": [doc]}, headers=KEY)
        assert written.status_code == 200, written.text
        after = client.post("/search", json=body, headers=KEY).json()
        assert not after["cached"] and after["index_version"] == written.json()["index_version"] > before["index_version"]
        assert after["results"][0]["id"] == "glacier-new"
