"""hybrid: the top SIEVE_HYBRID_DEPTH of be and of bm25, fused by reciprocal rank; each candidate keeps both
first-stage scores (columns be and bm25)."""
from sieve.pipeline.engine_first_stage import EngineHybrid, answers_itself
from sieve.pipeline.first_stage import HybridRetrieve
from sieve.pipeline.registry import RETRIEVER, StageSpec, register

SPEC = register(StageSpec(
    name="hybrid", role=RETRIEVER, summary="reciprocal-rank fusion of be and bm25",
    build=lambda ctx: [EngineHybrid(ctx.index, ctx.k, ctx.options.hybrid) if answers_itself(ctx.index)
                       else HybridRetrieve(ctx.index, ctx.k, ctx.options.hybrid, ctx.options.dense)],
    query_towers=lambda model, biencoder: {"be": biencoder},
    score_keys=("retrieve", "be", "bm25"), timing_keys=("be_encode", "mips", "bm25", "fuse"), needs=("lexical",),
    reads=("hybrid_depth", "rrf_k", "hybrid_weight_be", "hybrid_weight_bm25"),
))
