"""cmc: CMC (Song et al. 2024) scores every candidate in the context of all the others (sieve/models/cmc.py); the
shipped default also fuses each candidate's first-stage evidence (sieve/pipeline/evidence.py)."""
from __future__ import annotations

import logging

import numpy as np

from sieve.models.cmc_checkpoint import CMCBundle, load_cmc, untrained_cmc
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.registry import RERANKER, LoadContext, RerankContext, StageSpec, register
from sieve.pipeline.rerank_inputs import check_work, indexed_rows, rerank_candidates
from sieve.pipeline.stages import CMCRerank
from sieve.stages.common import model_identity

log = logging.getLogger("sieve")


def load(ctx: LoadContext) -> CMCBundle | None:
    """The CMC in the load order of Settings.cmc_choices: SIEVE_CMC_PATH when set (it must fit), else the served
    index's adapted CMC (`sieve adapt`; its directory's or its Qdrant collection's, never another index's), else the
    shipped default, else the identity CMC. The shipped default was trained on the packaged bi-encoder's vectors and
    an adapted one on the index's bi-encoder: one that does not fit the configured bi-encoder is passed over (said in
    the log)."""
    settings = ctx.settings
    if not settings.cmc_enabled:
        return None
    return load_first(settings.cmc_choices(live_adapted(settings, ctx.index)), ctx.biencoder, ctx.index)


def live_adapted(settings, index):
    """The served index's live adapted CMC (index/adapted.py: its directory's, or its Qdrant collection's), None
    when it was never adapted, SIEVE_CMC_PATH is set, or the store cannot be read now (said in the log: the CMC
    after it in the load order is served, and the next check swaps the adapted one in)."""
    if settings.cmc_path is not None:
        return None
    store = settings.adapted_store(index)
    try:
        return store.current()
    except Exception as exc:  # noqa: BLE001 - e.g. Qdrant down at start-up: serve, and look again later
        log.warning("could not read the adapted CMC of %s (%s); serving the next CMC in the load order", store.where,
                    exc)
        return None


def load_first(choices: list, biencoder, index) -> CMCBundle:
    """The first of (source, path) that loads and fits; a "setting" that does not fit (or is unreadable) raises."""
    for source, path in choices:
        if path is None:
            # an untrained query tower equals the bi-encoder: share it, and the searcher encodes the query once
            return untrained_cmc(biencoder, share_query_tower=True)
        try:
            cmc = load_cmc(path, biencoder)
            if cmc.config.mode == "separate" and not index.has_store("cmc"):
                raise ValueError(f"CMC checkpoint {path} is in separate mode but the index has no 'cmc' "
                                 "embedding store; build it with `sieve index build ... --cmc-checkpoint` "
                                 "or `sieve index add-store`")
        except Exception as exc:  # noqa: BLE001 - only an explicitly configured checkpoint may stop the start-up
            if source == "setting":
                raise
            log.warning("the %s CMC %s does not fit the configured bi-encoder or cannot be read (%s); passing it "
                        "over", source, path, exc)
            continue
        return cmc
    return untrained_cmc(biencoder, share_query_tower=True)


def rerank(ctx: RerankContext) -> list | None:
    """Indexed documents reuse their stored vectors, other texts are encoded by the candidate tower within the
    deadline; None (the caller's order) when time runs out while encoding."""
    bundle, state = ctx.model, ctx.state
    tower = bundle.candidate_tower or ctx.biencoder
    rows = indexed_rows(ctx.index, ctx.items, ctx.texts)
    check_work([t for t, row in zip(ctx.texts, rows) if row < 0], tower.lengths.doc_max_length, ctx.max_tokens,
               tower.tokenizer)
    ctx.encode_query({"cmc": bundle.query_tower})
    state.candidates = rerank_candidates(ctx.index, ctx.items, ctx.texts, bundle, ctx.biencoder, state)
    if state.candidates is None:  # out of time while encoding: nothing scored them all
        state.candidates = Candidates(rows=np.asarray(rows), texts=ctx.texts)
        return None
    state.ran.append("retrieve")
    return [CMCRerank(bundle, ctx.index, ctx.options.batching.cmc_candidates)]


def identity(bundle: CMCBundle) -> list:
    return [model_identity(bundle.query_tower), bundle.name, bundle.base_model_hash, bundle.weights_hash]


def index_store(bundle: CMCBundle):
    """A separate-mode CMC has its own candidate tower: new documents get their 'cmc' vectors from it."""
    return ("cmc", bundle.candidate_tower) if bundle.candidate_tower is not None else None


SPEC = register(StageSpec(
    name="cmc", role=RERANKER, summary="CMC over all retrieved candidates (shipped default: cmc-fusion)",
    build=lambda ctx: [CMCRerank(ctx.model, ctx.index, ctx.options.batching.cmc_candidates)],
    load=load, query_towers=lambda bundle, biencoder: {"cmc": bundle.query_tower}, rerank=rerank,
    identity=identity, timing_keys=("cmc_encode", "candidate_encode", "cmc"),
    reads=("cmc_enabled", "cmc_path", "cmc_batch_candidates"),
    unavailable="none (or enable SIEVE_CMC_ENABLED)", extra={"index_store": index_store},
))
