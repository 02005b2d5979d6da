"""Runs each named pipeline over the judged queries of a split through a backend and summarises it.

A pipeline is a SearchParams recipe; the backend (in-process Searcher or HTTP) decides where it runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from tqdm.auto import tqdm

from sieve.evaluation.backends import QueryResult
from sieve.evaluation.defaults import DEFAULT_PIPELINES  # noqa: F401 (re-exported)
from sieve.evaluation.dataset import EvalData
from sieve.evaluation.summary import summarize
from sieve.pipeline import registry
from sieve.pipeline.searcher import SearchParams

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




def pipeline(name: str) -> Pipeline:
    """`retriever[+reranker][+cross_encoder]`, each a registered stage (sieve/pipeline/registry.py); the cross-
    encoder scores cmc_k candidates after a reranker, else ce_k."""
    first, *rest = name.split("+")
    spec = registry.get(first)
    if spec is None or spec.role != registry.RETRIEVER:
        raise ValueError(f"pipeline {name!r}: {first!r} is not a retriever ({', '.join(registry.names(registry.RETRIEVER))})")
    rerank, ce = "none", None
    for part in rest:
        stage = registry.get(part)
        if stage is not None and stage.role == registry.RERANKER and rerank == "none" and ce is None:
            rerank = part
        elif stage is not None and stage.role == registry.CROSS_ENCODER and ce is None:
            ce = part
        else:
            raise ValueError(f"pipeline {name!r}: {part!r} is not a reranker or cross-encoder in place "
                             f"(retriever[+reranker][+cross_encoder])")
    needs = tuple(part for part in name.split("+") if registry.get(part).optional)
    return Pipeline(needs, rerank, ce is not None, "cmc_k" if rerank != "none" and ce else "ce_k", retriever=first,
                    ce_model=ce or "ce")


def stage_help(name: str) -> str:
    spec = registry.get(name)
    return f"{name} ({spec.summary}; {spec.unavailable})" if spec.unavailable else f"{name} ({spec.summary})"


def parse_pipelines(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"no pipeline in {text!r}; e.g. {', '.join(DEFAULT_PIPELINES)}")
    for name in names:
        pipeline(name)  # raises with what is wrong
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
        recipe = pipeline(name)
        missing = [stage for stage in recipe.needs if stage not in backend.stages]
        if missing:
            log(f"skipping {name}: it needs {' and '.join(stage_help(s) for s in missing)}, which is not configured")
            continue
        started = time.perf_counter()
        results[name] = run_pipeline(backend, recipe, data, cfg, ce_log)
        log(f"{name}: {len(data.queries)} queries in {time.perf_counter() - started:.1f}s, "
            f"nDCG@10 {results[name]['ndcg@10']:.4f}")
    return results
