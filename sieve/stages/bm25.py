"""bm25: BM25 over title + text, the lexical part inside each index version (sieve/index/lexical.py)."""
from sieve.pipeline.engine_first_stage import EngineLexical, answers_itself
from sieve.pipeline.first_stage import LexicalRetrieve
from sieve.pipeline.registry import RETRIEVER, StageSpec, register

SPEC = register(StageSpec(
    name="bm25", role=RETRIEVER, summary="BM25 over the index's lexical part",
    build=lambda ctx: [(EngineLexical if answers_itself(ctx.index) else LexicalRetrieve)(ctx.index, ctx.k)],
    score_keys=("retrieve", "bm25"), timing_keys=("bm25",), needs=("lexical",),
    reads=("lexical_enabled", "lexical_language"),
))
