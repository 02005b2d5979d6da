"""be: the bi-encoder's query vector searched over the index's FAISS part (maximum inner product)."""
from sieve.pipeline.engine_first_stage import EngineDense, answers_itself
from sieve.pipeline.registry import RETRIEVER, StageSpec, register
from sieve.pipeline.stages import Retrieve

SPEC = register(StageSpec(
    name="be", role=RETRIEVER, summary="bi-encoder + FAISS maximum inner-product search",
    build=lambda ctx: [EngineDense(ctx.index, ctx.k) if answers_itself(ctx.index)
                       else Retrieve(ctx.index, ctx.k, ctx.options.dense)],
    query_towers=lambda model, biencoder: {"be": biencoder},
    timing_keys=("be_encode", "mips"),
    reads=("nprobe", "ef_search", "faiss_gpu"),
))
