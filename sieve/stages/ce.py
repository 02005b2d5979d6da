"""ce: the cross-encoder jointly encodes (query, document) for the head of the list (K' = cmc_k candidates); any
local Hugging Face sequence-classification checkpoint, or one of Sieve's heads (sieve/models/ce_heads.py), or a
remote rerank server (SIEVE_CE_URL: TEI, infinity, Cohere-compatible, another Sieve; sieve/pipeline/remote_ce.py)."""
from __future__ import annotations

import numpy as np

from sieve.models import ce_tokens
from sieve.models.clip import clip_chars
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.registry import CROSS_ENCODER, LoadContext, RerankContext, StageSpec, register
from sieve.pipeline.remote_ce import RemoteConfig, RemoteCrossEncoder, RemoteCrossEncoderRerank
from sieve.pipeline.rerank_inputs import check_work, indexed_rows
from sieve.pipeline.stages import CrossEncoderRerank
from sieve.stages.common import model_identity


def load_remote(settings) -> RemoteCrossEncoder | None:
    """The client for SIEVE_CE_URL (docs/remote-cross-encoder.md); None when it is unset."""
    if settings.ce_url is None:
        return None
    config = RemoteConfig(
        url=settings.ce_url, shape=settings.ce_shape, model=settings.ce_model_name,
        api_key=settings.ce_api_key.get_secret_value() if settings.ce_api_key else None,
        timeout_s=settings.ce_timeout_ms / 1000, retries=settings.ce_retries,
        backoff_s=settings.ce_retry_backoff_ms / 1000, failures_to_open=settings.ce_breaker_failures,
        open_s=settings.ce_breaker_open_s, max_connections=settings.max_inflight,
        lengths=PairLengths(settings.ce_query_max_length or 64, settings.ce_max_length or 512))
    return RemoteCrossEncoder(config)


def load(ctx: LoadContext) -> CrossEncoder | RemoteCrossEncoder | None:
    """SIEVE_CE_URL set: the remote cross-encoder (no model loaded here); else the local checkpoint."""
    if (remote := load_remote(ctx.settings)) is not None:
        return remote
    path = ctx.settings.resolved_cross_encoder_path()
    if path is None:
        return None
    return CrossEncoder.from_pretrained(path, lengths=ctx.settings.ce_lengths(path), device=ctx.device,
                                        batch_size=ctx.settings.ce_batch_size)


def stage_for(model, index, k: int, options):
    if isinstance(model, RemoteCrossEncoder):
        return RemoteCrossEncoderRerank(model, index, k, options.stage_budgets_ms)
    return CrossEncoderRerank(model, index, k, options.batching.ce_tokens)


def build(ctx) -> list:
    return [stage_for(ctx.model, ctx.index, ctx.k, ctx.options)]


def query_cost(tokenizer, query: str, query_max_length: int) -> int:
    """What the query adds to every (query, document) pair: its tokens (cut at its own length) and one separator;
    the bound min(characters, query_max_length) + 1 without a tokenizer."""
    if tokenizer is None:
        return min(len(query), query_max_length) + 1
    return min(len(tokenizer(clip_chars(query, query_max_length), add_special_tokens=False)["input_ids"]), query_max_length) + 1


def texts_reranker(stage_class=None):
    """/rerank with a cross-encoder stage: the caller's texts in the caller's order, all of them scored."""

    def rerank(ctx: RerankContext) -> list:
        tokenizer, lengths = getattr(ctx.model, "tokenizer", None), ctx.model.lengths
        check_work(ctx.texts, lengths.max_length, ctx.max_tokens, tokenizer,
                   query_cost(tokenizer, ctx.state.query, lengths.query_max_length))
        # indexed documents keep their rows where the index holds this cross-encoder's token ids: read, not tokenized
        stored = ce_tokens.stored_for(ctx.model, ctx.index)  # False for a remote one (no ids of its own)
        rows = indexed_rows(ctx.index, ctx.items, ctx.texts) if stored else [-1] * len(ctx.texts)
        ctx.state.candidates = Candidates(rows=np.asarray(rows, dtype=np.int64), texts=ctx.texts)
        if stage_class is None:
            return [stage_for(ctx.model, ctx.index, len(ctx.texts), ctx.options)]
        return [stage_class(ctx.model, ctx.index, len(ctx.texts), ctx.options.batching.ce_tokens)]
    return rerank


def index_store(model) -> tuple[str, ce_tokens.CETokenStore] | None:
    """The documents' token ids a local cross-encoder reads from the index (models/ce_tokens.py): new documents get
    their rows on every write to an index that holds the store."""
    return (ce_tokens.STORE, ce_tokens.CETokenStore(model)) if ce_tokens.supports(model) else None


def identity(model) -> list | None:
    return model.identity() if isinstance(model, RemoteCrossEncoder) else model_identity(model)


SPEC = register(StageSpec(
    name="ce", role=CROSS_ENCODER, summary="cross-encoder over the top cmc_k (K') candidates",
    build=build, load=load, rerank=texts_reranker(), identity=identity, model_role="cross_encoder",
    reads=("cross_encoder_enabled", "cross_encoder_path", "ce_query_max_length", "ce_max_length", "ce_batch_size",
           "ce_batch_tokens", "ce_url", "ce_shape", "ce_model_name", "ce_api_key", "ce_timeout_ms", "ce_retries",
           "ce_retry_backoff_ms", "ce_breaker_failures", "ce_breaker_open_s"),
    unavailable="false (the server operator sets SIEVE_CROSS_ENCODER_PATH to a local checkpoint directory)",
    extra={"index_store": index_store},
))
