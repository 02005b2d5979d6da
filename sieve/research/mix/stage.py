"""mix: the MixEncoder reranks all retrieved candidates from their stored context embeddings (index store 'mix')."""
from __future__ import annotations

import numpy as np

from sieve.pipeline.candidates import Candidates
from sieve.pipeline.registry import RERANKER, LoadContext, RerankContext, StageSpec, register
from sieve.pipeline.rerank_inputs import check_work, indexed_rows
from sieve.research.mix.runtime import STORE, MixLengths, MixRuntime
from sieve.research.rerankers import MixRerank
from sieve.research.settings import MixSettings
from sieve.stages.common import model_identity


def load(ctx: LoadContext) -> MixRuntime | None:
    """The MixEncoder, refused unless the index holds the context embeddings this very checkpoint computed."""
    settings, path = ctx.settings, ctx.own.mix_path
    if path is None:
        return None
    mix = MixRuntime.from_pretrained(path, device=ctx.device, batch_size=settings.encode_batch_size,
                                     lengths=MixLengths(settings.query_max_length, settings.doc_max_length))
    built = ctx.index.manifest.stores.get(STORE)
    if built is None or built["model_hash"] != mix.weights_hash:
        found = "has no 'mix' store" if built is None else f"has a 'mix' store from another model ({built['model_name']})"
        raise ValueError(f"SIEVE_MIX_PATH={path} needs its context embeddings in the index, but the index "
                         f"at {settings.index_dir} {found}; run `sieve index add-store --index {settings.index_dir} "
                         f"--mix-checkpoint {path}`")
    return mix


def rerank(ctx: RerankContext) -> list:
    """Indexed documents reuse their stored context embeddings; other texts are encoded on the worker."""
    rows = indexed_rows(ctx.index, ctx.items, ctx.texts)
    check_work([t for t, row in zip(ctx.texts, rows) if row < 0], ctx.model.lengths.doc_max_length, ctx.max_tokens)
    ctx.state.candidates = Candidates(rows=np.asarray(rows), texts=ctx.texts)
    return [MixRerank(ctx.model, ctx.index)]


def eval_store(settings, own: MixSettings, biencoder):
    """`sieve eval`: the MixEncoder's context embeddings go into the eval index when SIEVE_MIX_PATH is set."""
    if own.mix_path is None:
        return None
    return STORE, MixRuntime.from_pretrained(own.mix_path, device=biencoder.device,
                                             batch_size=settings.encode_batch_size,
                                             lengths=MixLengths(settings.query_max_length, settings.doc_max_length))


SPEC = register(StageSpec(
    name="mix", role=RERANKER, summary="MixEncoder over the candidates' stored context embeddings",
    build=lambda ctx: [MixRerank(ctx.model, ctx.index)], load=load, rerank=rerank, identity=model_identity,
    settings=MixSettings, research=True, timing_keys=("mix", "candidate_encode"), needs=("store:mix",),
    reads=("query_max_length", "doc_max_length", "encode_batch_size"),
    unavailable="cmc | none (the server operator sets SIEVE_MIX_PATH)",
    extra={"index_store": lambda mix: (STORE, mix), "eval_store": eval_store},
))
