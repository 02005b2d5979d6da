"""Runs each named pipeline over the judged queries of a split through a backend and summarises it.

A pipeline is a SearchParams recipe; the backend (in-process Searcher or HTTP) decides where it runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from tqdm.auto import tqdm

from sieve.evaluation.backends import QueryResult
from sieve.evaluation.dataset import EvalData
from sieve.evaluation.summary import summarize
from sieve.pipeline.searcher import SearchParams

STAGE_HELP = {"cmc": "the CMC stage (SIEVE_CMC_ENABLED=true)",
              "ce": "a cross-encoder (SIEVE_CROSS_ENCODER_PATH)",
              "anncur": "an annCUR index (SIEVE_ANNCUR_DIR, built by `sieve index anncur`)",
              "mix": "a MixEncoder (SIEVE_MIX_PATH, its context store in the index)",
              "ce_late": "a late-interaction cross-encoder (SIEVE_LATE_CE_PATH)"}


@dataclass(frozen=True)
class EvalConfig:
    retrieve_k: int = 512  # bi-encoder candidates (what CMC reranks)
    cmc_k: int = 16  # K': candidates CMC passes to the cross-encoder in be+cmc+ce
    ce_k: int = 64  # candidates the bi-encoder passes to the cross-encoder in be+ce
    top_k: int = 100  # ranking depth kept per query: Recall@100 needs 100

    def __post_init__(self):
        if self.retrieve_k < self.top_k:
            raise ValueError(f"retrieve_k {self.retrieve_k} must be >= {self.top_k} "
                             f"(rankings are scored to depth {self.top_k})")
        for name in ("cmc_k", "ce_k"):
            if not 1 <= getattr(self, name) <= self.retrieve_k:
                raise ValueError(f"{name} {getattr(self, name)} must be in 1..retrieve_k ({self.retrieve_k})")


@dataclass(frozen=True)
class Pipeline:
    needs: tuple[str, ...]  # optional stages that must be loaded
    rerank: str  # SearchParams.rerank
    cross_encoder: bool
    ce_input: str = "ce_k"  # EvalConfig field: how many candidates reach the cross-encoder
    retriever: str = "be"  # SearchParams.retriever: "anncur" retrieves with the cross-encoder itself
    ce_model: str = "ce"  # SearchParams.ce_model: "ce_late" = the late-interaction cross-encoder

    def params(self, query: str, cfg: EvalConfig) -> SearchParams:
        return SearchParams(query, top_k=cfg.top_k, retrieve_k=cfg.retrieve_k, rerank=self.rerank,
                            cmc_k=getattr(cfg, self.ce_input), cross_encoder=self.cross_encoder,
                            retriever=self.retriever, ce_model=self.ce_model)


PIPELINES = {
    "be": Pipeline((), "none", False),
    "be+cmc": Pipeline(("cmc",), "cmc", False),
    "be+ce": Pipeline(("ce",), "none", True, "ce_k"),
    "be+cmc+ce": Pipeline(("cmc", "ce"), "cmc", True, "cmc_k"),
    # annCUR: k_i anchor pairs + MIPS over the annCUR index; +ce: the anchors and the best ce_k others scored exactly
    "anncur": Pipeline(("anncur",), "none", False, "ce_k", "anncur"),
    "anncur+ce": Pipeline(("anncur",), "none", True, "ce_k", "anncur"),
    # issue 5: the MixEncoder ranks all retrieve_k (as CMC does); ce_late = the cls+late cross-encoder
    "be+mix": Pipeline(("mix",), "mix", False),
    "be+mix+ce": Pipeline(("mix", "ce"), "mix", True, "cmc_k"),
    "be+ce_late": Pipeline(("ce_late",), "none", True, "ce_k", ce_model="ce_late"),
    "be+cmc+ce_late": Pipeline(("cmc", "ce_late"), "cmc", True, "cmc_k", ce_model="ce_late"),
    # issue 15: the lexical first stage and its fusion with the bi-encoder (the index's BM25 part)
    "bm25": Pipeline((), "none", False, retriever="bm25"),
    "hybrid": Pipeline((), "none", False, retriever="hybrid"),
    "hybrid+cmc": Pipeline(("cmc",), "cmc", False, retriever="hybrid"),
    "hybrid+ce": Pipeline(("ce",), "none", True, "ce_k", retriever="hybrid"),
    "hybrid+cmc+ce": Pipeline(("cmc", "ce"), "cmc", True, "cmc_k", retriever="hybrid"),
}


def parse_pipelines(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PIPELINES]
    if unknown or not names:
        raise ValueError(f"unknown pipeline(s) {unknown or text!r}; allowed: {', '.join(PIPELINES)}")
    return list(dict.fromkeys(names))


@dataclass
class CEScored:
    """One query's cross-encoder scores from a pipeline run, and the CE time that call took (Table 2 reuses them
    instead of scoring the same pairs again)."""

    scores: dict[str, float]  # doc id -> CE score
    ms: float


@dataclass
class Run:
    """Per-query outcomes of one pipeline, in the order of data.queries (subsets are scored from these)."""
    rankings: dict[str, list[str]]
    timings: dict[str, dict[str, float]]
    pairs: dict[str, int]

    def summary(self, qrels: dict[str, dict[str, int]]) -> dict:
        ids = [q for q in self.rankings if q in qrels]
        return summarize({q: self.rankings[q] for q in ids}, [self.timings[q] for q in ids],
                         [self.pairs[q] for q in ids], {q: qrels[q] for q in ids})


def collect(backend, pipeline: Pipeline, data: EvalData, cfg: EvalConfig,
            ce_log: dict[str, list[CEScored]] | None = None) -> Run:
    """One warm-up query first, so lazy initialisation (thread pools, allocator) stays out of the latencies.
    ce_log, when given, collects per query id what the cross-encoder scored. With data.ignore_identical_ids a
    retrieved document whose id is the query's own id is dropped (BEIR's rule for ArguAna)."""
    backend.search(pipeline.params(next(iter(data.queries.values())), cfg))
    run = Run({}, {}, {})
    for qid, text in tqdm(data.queries.items(), desc="queries", unit="query", leave=False):
        result: QueryResult = backend.search(pipeline.params(text, cfg))
        ids = [i for i in result.ids if i != qid] if data.ignore_identical_ids else result.ids
        run.rankings[qid], run.timings[qid], run.pairs[qid] = ids, result.timings_ms, result.ce_pairs
        if ce_log is not None and result.ce_scores and pipeline.retriever == "be":  # annCUR may run another CE
            ce_log.setdefault(qid, []).append(CEScored(result.ce_scores, result.timings_ms.get("ce", 0.0)))
    return run


def run_pipeline(backend, pipeline: Pipeline, data: EvalData, cfg: EvalConfig,
                 ce_log: dict[str, list[CEScored]] | None = None) -> dict:
    return collect(backend, pipeline, data, cfg, ce_log).summary(data.qrels)


def run_pipelines(backend, data: EvalData, names: list[str], cfg: EvalConfig,
                  log: Callable[[str], None] = print, ce_log: dict | None = None) -> dict[str, dict]:
    """Pipelines whose stages the backend lacks are skipped with a message; the others run in order."""
    results = {}
    for name in names:
        pipeline = PIPELINES[name]
        missing = [stage for stage in pipeline.needs if stage not in backend.stages]
        if missing:
            log(f"skipping {name}: it needs {' and '.join(STAGE_HELP[s] for s in missing)}, which is not configured")
            continue
        started = time.perf_counter()
        results[name] = run_pipeline(backend, pipeline, data, cfg, ce_log)
        log(f"{name}: {len(data.queries)} queries in {time.perf_counter() - started:.1f}s, "
            f"nDCG@10 {results[name]['ndcg@10']:.4f}")
    return results
