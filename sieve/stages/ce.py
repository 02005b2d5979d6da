"""ce: the cross-encoder jointly encodes (query, document) for the head of the list (K' = cmc_k candidates); any
local Hugging Face sequence-classification checkpoint, or one of Sieve's heads (sieve/models/ce_heads.py)."""
from __future__ import annotations

import numpy as np

from sieve.models.cross_encoder import CrossEncoder
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.registry import CROSS_ENCODER, LoadContext, RerankContext, StageSpec, register
from sieve.pipeline.rerank_inputs import check_work
from sieve.pipeline.stages import CrossEncoderRerank
from sieve.stages.common import model_identity


def load(ctx: LoadContext) -> CrossEncoder | None:
    path = ctx.settings.resolved_cross_encoder_path()
    if path is None:
        return None
    return CrossEncoder.from_pretrained(path, lengths=ctx.settings.ce_lengths(path), device=ctx.device,
                                        batch_size=ctx.settings.ce_batch_size)


def build(ctx) -> list:
    return [CrossEncoderRerank(ctx.model, ctx.index, ctx.k, ctx.options.batching.ce_tokens)]


def texts_reranker(stage_class=CrossEncoderRerank):
    """/rerank with a cross-encoder stage: the caller's texts in the caller's order, all of them scored."""

    def rerank(ctx: RerankContext) -> list:
        check_work(ctx.texts, ctx.model.lengths.max_length, ctx.max_tokens)
        ctx.state.candidates = Candidates(rows=np.full(len(ctx.texts), -1), texts=ctx.texts)
        return [stage_class(ctx.model, ctx.index, len(ctx.texts), ctx.options.batching.ce_tokens)]
    return rerank


SPEC = register(StageSpec(
    name="ce", role=CROSS_ENCODER, summary="cross-encoder over the top cmc_k (K') candidates",
    build=build, load=load, rerank=texts_reranker(), identity=model_identity, model_role="cross_encoder",
    reads=("cross_encoder_enabled", "cross_encoder_path", "ce_query_max_length", "ce_max_length", "ce_batch_size",
           "ce_batch_tokens"),
    unavailable="false (the server operator sets SIEVE_CROSS_ENCODER_PATH to a local checkpoint directory)",
))
