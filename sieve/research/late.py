"""ce_late: a second cross-encoder (a cls+late or gated+late checkpoint) that scores the head under its own name,
so it can serve beside the plain one and each request picks which (`ce_model`)."""
from __future__ import annotations

from sieve.models.cross_encoder import CrossEncoder
from sieve.pipeline.registry import CROSS_ENCODER, LoadContext, StageSpec, register
from sieve.pipeline.stages import CrossEncoderRerank
from sieve.research.settings import LateCrossEncoderSettings
from sieve.stages.ce import texts_reranker
from sieve.stages.common import model_identity


class LateCrossEncoderRerank(CrossEncoderRerank):
    """The cross-encoder stage for a second cross-encoder (a gated+late or cls+late checkpoint), scored under "ce_late"."""

    name = "ce_late"

    def __init__(self, cross_encoder: CrossEncoder, index, k: int, batch_tokens: int = 8192):
        super().__init__(cross_encoder, index, k, batch_tokens)
        self.batch_key = f"ce_late:{id(cross_encoder)}"


def load(ctx: LoadContext) -> CrossEncoder | None:
    """With the pair lengths of the settings or of its training."""
    path = ctx.own.late_ce_path
    if path is None:
        return None
    return CrossEncoder.from_pretrained(path, device=ctx.device, batch_size=ctx.settings.ce_batch_size,
                                        lengths=ctx.settings.ce_lengths(path))


SPEC = register(StageSpec(
    name="ce_late", role=CROSS_ENCODER, summary="late-interaction cross-encoder over the top cmc_k",
    build=lambda ctx: [LateCrossEncoderRerank(ctx.model, ctx.index, ctx.k, ctx.options.batching.ce_tokens)],
    load=load, rerank=texts_reranker(LateCrossEncoderRerank), identity=model_identity, settings=LateCrossEncoderSettings, research=True,
    model_role="late_cross_encoder", reads=("ce_query_max_length", "ce_max_length", "ce_batch_size"),
    unavailable="ce (the server operator sets SIEVE_LATE_CE_PATH to a late-interaction checkpoint)",
))
