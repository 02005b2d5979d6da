"""annCUR retrieval (Yadav et al. 2022) as pipeline stages: the cross-encoder itself finds the candidates.

AnnCURRetrieve ("anncur"): the cross-encoder scores the query against the k_i anchor items (its embedding e_q),
then MIPS over the annCUR index's item embeddings gives the top k by approximate cross-encoder score (column
"retrieve"). No bi-encoder is involved.
AnnCURRerank ("ce", optional, skippable): exact scores for the anchors (known already) and the best `k` other
candidates; those lead the list by exact score (column "ce"), the rest keep the approximate order below them.
Anchors the MIPS did not return are added, since their exact scores cost nothing more. Out of time, the
approximate order stands.

The annCUR index is built over the main index's rows (same corpus hash, checked by the searcher), so ids and
documents come from the request's index version. Cross-encoder work goes through the cross-encoder's batcher
(the batch key of the CE stage), so it is batched with every other request's pairs.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass

import numpy as np

from sieve.research.anncur.index import AnnCURIndex
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.pipeline.errors import RequestError, StageUnavailable
from sieve.pipeline.registry import RETRIEVER, LoadContext, StageSpec, register
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.stages import CrossEncoderRerank
from sieve.pipeline.state import QueryState
from sieve.research.settings import AnnCURSettings
from sieve.stages.common import model_identity

log = logging.getLogger("sieve")


@dataclass(frozen=True)
class AnnCUR:
    """What the searcher holds: a loaded annCUR index and the cross-encoder that built it."""

    index: AnnCURIndex
    cross_encoder: CrossEncoder

    @property
    def name(self) -> str:  # /readyz names annCUR by the cross-encoder that built it
        return self.cross_encoder.name

    def close(self) -> None:
        self.index.close()


class AnnCURRetrieve:
    name = "anncur"
    skippable = False  # it produces the candidates

    def __init__(self, anncur: AnnCUR, k: int, batch_tokens: int = 8192):
        self.anncur = anncur
        self.k = k
        self.scorer = CrossEncoderRerank(anncur.cross_encoder, None, 0, batch_tokens)  # its batched compute only
        self.batch_key = self.scorer.batch_key
        self.anchor_scores: np.ndarray | None = None  # (k_i,) exact, for AnnCURRerank

    def prepare(self, state: QueryState) -> tuple:
        state.counts["ce"] = state.counts.get("ce", 0) + self.anncur.index.k_i  # cross-encoder pairs of the request
        return state.query, self.anncur.index.anchor_texts, None  # no deadline: without it there is no answer

    def compute(self, items):
        return self.scorer.compute(items)

    def finish(self, state: QueryState, anchor_scores: np.ndarray) -> QueryState:
        self.anchor_scores = np.asarray(anchor_scores, dtype=np.float32)  # (k_i,)
        with state.timed("mips"):
            scores, rows = self.anncur.index.search(self.anchor_scores, self.k)
        state.candidates = Candidates(rows=rows, scores={"retrieve": scores.astype(np.float32)})
        state.counts[self.name] = len(state.candidates)
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed(self.name):
            scores = self.compute([self.prepare(state)])[0]
        return self.finish(state, scores)


class AnnCURRerank:
    name = "ce"
    skippable = True

    def __init__(self, retrieve: AnnCURRetrieve, k: int, index, batch_tokens: int = 8192):
        self.retrieve = retrieve
        self.k = k
        self.index = index
        self.scorer = CrossEncoderRerank(retrieve.anncur.cross_encoder, index, 0, batch_tokens)
        self.batch_key = self.scorer.batch_key
        self.rows = np.empty(0, dtype=np.int64)

    def prepare(self, state: QueryState) -> tuple:
        anchors = self.retrieve.anncur.index.anchor_rows
        self.rows = state.candidates.rows[~np.isin(state.candidates.rows, anchors)][:self.k]
        state.counts["ce"] = state.counts.get("ce", 0) + len(self.rows)
        return state.query, [doc.full_text for doc in self.index.documents(self.rows)], state.deadline

    def compute(self, items):
        return self.scorer.compute(items)

    def with_anchors(self, cands: Candidates) -> Candidates:
        """The list with every anchor in it: missing ones appended with their approximate score."""
        anncur = self.retrieve.anncur.index
        missing = anncur.anchor_rows[~np.isin(anncur.anchor_rows, cands.rows)]
        if not len(missing):
            return cands
        approx = anncur.index.embeddings(missing) @ self.retrieve.anchor_scores  # (m,)
        return Candidates(rows=np.concatenate([cands.rows, missing]),
                          scores={"retrieve": np.concatenate([cands.scores["retrieve"], approx]).astype(np.float32)})

    def finish(self, state: QueryState, scores: np.ndarray) -> QueryState:
        cands = self.with_anchors(state.candidates)
        exact = dict(zip(self.retrieve.anncur.index.anchor_rows.tolist(), self.retrieve.anchor_scores.tolist()))
        exact.update(zip(self.rows.tolist(), np.asarray(scores, dtype=np.float32).tolist()))
        column = np.array([exact.get(int(r), np.nan) for r in cands.rows], dtype=np.float32)  # (K,)
        scored = np.flatnonzero(~np.isnan(column))
        order = np.concatenate([scored[np.argsort(-column[scored], kind="stable")], np.flatnonzero(np.isnan(column))])
        state.candidates = cands.with_scores("ce", column).take(order)
        state.candidates.validate()
        return state

    def __call__(self, state: QueryState) -> QueryState:
        with state.timed(self.name):
            scores = self.compute([self.prepare(state)])[0]
        return self.finish(state, scores)


def anncur_stages(anncur: AnnCUR, k: int, rerank_k: int, index, batch_tokens: int = 8192) -> list:
    """annCUR's top k, then (rerank_k > 0) the exact rerank of the anchors and the best rerank_k others."""
    retrieve = AnnCURRetrieve(anncur, k, batch_tokens)
    return [retrieve] + ([AnnCURRerank(retrieve, rerank_k, index, batch_tokens)] if rerank_k > 0 else [])


# -- the stage spec -----------------------------------------------------------------------------------------
def load(ctx: LoadContext) -> AnnCUR | None:
    """The annCUR index and the cross-encoder that built it, run with the pair lengths it was built with (other
    lengths give other scores than the ones its item embeddings approximate)."""
    own, settings = ctx.own, ctx.settings
    if own.anncur_dir is None:
        return None
    path = own.anncur_cross_encoder_path or settings.resolved_cross_encoder_path()
    if path is None:
        raise ValueError("SIEVE_ANNCUR_DIR is set but no cross-encoder is: set SIEVE_ANNCUR_CROSS_ENCODER_PATH (or "
                         "SIEVE_CROSS_ENCODER_PATH) to the checkpoint that built the annCUR index")
    anncur = AnnCURIndex.load(own.anncur_dir, use_gpu=settings.faiss_gpu and ctx.device.type == "cuda",
                              nprobe=settings.nprobe, ef_search=settings.ef_search)
    built = anncur.record["cross_encoder"]
    default = settings.ce_lengths(path)
    lengths = PairLengths(built.get("query_max_length") or default.query_max_length,
                          built.get("max_length") or default.max_length)
    loaded_ce = ctx.loaded.get("ce")
    reuse = loaded_ce is not None and path == settings.resolved_cross_encoder_path() and loaded_ce.lengths == lengths
    ce = loaded_ce if reuse else CrossEncoder.from_pretrained(path, lengths=lengths, device=ctx.device,
                                                              batch_size=settings.ce_batch_size)
    if anncur.corpus_hash != ctx.index.manifest.corpus_hash:
        log.warning("the annCUR index at %s covers other documents than %s holds now: retriever anncur answers 400 "
                    "until it is rebuilt with `sieve index anncur`", own.anncur_dir, settings.index_dir)
    if ce.weights_hash != anncur.index.manifest.model_hash:
        anncur.close()
        raise ValueError(f"the annCUR index at {own.anncur_dir} was built by cross-encoder "
                         f"{built.get('name')!r} (weights sha256 {anncur.index.manifest.model_hash[:12]}...), not by "
                         f"{path}; point SIEVE_ANNCUR_CROSS_ENCODER_PATH at that one or rebuild with `sieve index anncur`")
    return AnnCUR(anncur, ce)


def check(params, models: dict, index) -> None:
    """annCUR's own rules: nothing reranks its candidates by stored vectors, it reranks with its own
    cross-encoder, and its index must cover the documents the live index holds."""
    if params.rerank != "none":
        raise RequestError(f"rerank {params.rerank!r} reorders bi-encoder candidates by their stored vectors; "
                           "annCUR's come from the cross-encoder itself", field="rerank",
                           allowed="none with retriever anncur (cross_encoder: true reranks exactly)")
    if params.ce_model != "ce":
        raise RequestError("annCUR reranks with the cross-encoder that built its index", field="ce_model",
                           allowed="ce with retriever anncur")
    anncur = models.get("anncur")
    if anncur is not None and anncur.index.corpus_hash != index.manifest.corpus_hash:
        raise StageUnavailable("the annCUR index was built from other documents than the live index holds "
                               "(the index changed since)", field="retriever",
                               allowed="be, until the operator rebuilds it with `sieve index anncur`")


def build(ctx) -> list:
    rerank_k = ctx.params.cmc_k if ctx.params.cross_encoder else 0
    return anncur_stages(ctx.model, ctx.k, rerank_k, ctx.index, ctx.options.batching.ce_tokens)


def identity(anncur: AnnCUR) -> list:
    built = anncur.index
    return [model_identity(anncur.cross_encoder), built.index.version, built.corpus_hash,
            hashlib.sha256(json.dumps(built.record, sort_keys=True, default=str).encode()).hexdigest()]


SPEC = register(StageSpec(
    name="anncur", role=RETRIEVER, summary="annCUR: the cross-encoder retrieves via CUR item embeddings",
    build=build, load=load, identity=identity, settings=AnnCURSettings, research=True,
    score_keys=("retrieve", "ce"), timing_keys=("anncur", "mips", "ce"),
    reads=("cross_encoder_path", "ce_batch_size", "nprobe", "ef_search"),
    unavailable="be (the server operator sets SIEVE_ANNCUR_DIR to an index built by `sieve index anncur`)",
    extra={"owns_cross_encoder": True, "default_rerank": "none", "check": check},
))
