"""mix: the MixEncoder reranks all retrieved candidates from their stored context embeddings (index store 'mix')."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sieve.pipeline.candidates import Candidates
from sieve.pipeline.packing import expired
from sieve.pipeline.registry import RERANKER, LoadContext, RerankContext, StageSpec, register
from sieve.pipeline.rerank_inputs import check_work, indexed_rows
from sieve.pipeline.state import QueryState
from sieve.research.mix.runtime import STORE, MixLengths, MixRuntime
from sieve.research.settings import MixSettings
from sieve.stages.common import model_identity


class MixRerank:
    """Scores the first `k` candidates (all when k is None) with the MixEncoder and sorts them by that score; the
    rest keep their order below them."""

    name = "mix"
    skippable = True

    def __init__(self, mix: MixRuntime, index, k: int | None = None):
        self.mix = mix
        self.index = index
        self.k = k
        self.batch_key = f"mix:{id(mix)}"

    def contexts(self, cands: Candidates, n: int) -> tuple[np.ndarray, list[int], list[str]]:
        """(n, k * d) stored context embeddings; the positions (and texts) of candidates not in the index, whose
        rows are left to compute()."""
        rows = cands.rows[:n]
        out = np.zeros((n, self.mix.dim), dtype=np.float32)
        known = np.flatnonzero(rows >= 0)
        if len(known):
            out[known] = self.index.embeddings(rows[known], store=STORE)
        fresh = np.flatnonzero(rows < 0).tolist()
        return out, fresh, [cands.texts[i] for i in fresh] if fresh else []

    def prepare(self, state: QueryState) -> tuple:
        n = len(state.candidates) if self.k is None else min(self.k, len(state.candidates))
        contexts, fresh, texts = self.contexts(state.candidates, n)
        state.counts[self.name] = n
        if fresh:
            state.counts["candidate_encode"] = len(fresh)
        return state.query, contexts, fresh, texts, state.deadline

    def compute(self, items: Sequence[tuple]) -> list[np.ndarray | None]:
        """One query encoding per item; candidates without stored contexts are encoded here, on the worker."""
        results: list[np.ndarray | None] = []
        for query, contexts, fresh, texts, deadline in items:
            if expired(deadline):
                results.append(None)
                continue
            if fresh:
                contexts = contexts.copy()
                contexts[fresh] = self.mix.encode_documents(texts, progress=False)
            results.append(self.mix.score_states(self.mix.query_states(query), contexts))
        return results

    def finish(self, state: QueryState, scores: np.ndarray) -> QueryState:
        state.candidates = state.candidates.rerank_head(self.name, scores)
        state.candidates.validate()
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed(self.name):
            return self.finish(state, self.compute([self.prepare(state)])[0])


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
    check_work([t for t, row in zip(ctx.texts, rows) if row < 0], ctx.model.lengths.doc_max_length, ctx.max_tokens,
               getattr(ctx.model, "tokenizer", None))
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
