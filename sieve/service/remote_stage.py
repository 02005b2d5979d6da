"""Settings -> the remote cross-encoder (pipeline/remote_ce.py), and its breaker for /readyz and /metrics."""
from __future__ import annotations

from sieve.pipeline.remote_ce import RemoteConfig, RemoteCrossEncoder
from sieve.service.config import Settings


def load_remote_ce(settings: Settings) -> RemoteCrossEncoder | None:
    """The client for SIEVE_CE_URL; None when it is unset (the cross-encoder then runs in-process)."""
    if settings.ce_url is None:
        return None
    from sieve.models.cross_encoder import PairLengths

    config = RemoteConfig(
        url=settings.ce_url, shape=settings.ce_shape, model=settings.ce_model_name,
        api_key=settings.ce_api_key.get_secret_value() if settings.ce_api_key else None,
        timeout_s=settings.ce_timeout_ms / 1000, retries=settings.ce_retries,
        backoff_s=settings.ce_retry_backoff_ms / 1000, failures_to_open=settings.ce_breaker_failures,
        open_s=settings.ce_breaker_open_s, max_connections=settings.max_inflight,
        lengths=PairLengths(settings.ce_query_max_length or 64, settings.ce_max_length or 512))
    return RemoteCrossEncoder(config)
