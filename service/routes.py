"""Thin handlers: validate, call the pipeline, shape the reply. Sync functions, so FastAPI runs them in its
thread pool and model work never blocks the event loop."""
from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.errors import RequestError
from pipeline.searcher import Outcome, RerankItem, SearchParams, Searcher
from service.components import Components
from service.config import Settings
from service.metrics import Metrics
from service import schemas

router = APIRouter()
ERRORS = {code: {"model": schemas.ErrorResponse} for code in (400, 413, 422)}


def get_components(request: Request) -> Components:
    return request.app.state.components


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


ComponentsDep = Annotated[Components, Depends(get_components)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def check_limit(value: int, limit: int, field: str, setting: str) -> None:
    if value > limit:
        raise RequestError(f"{field} {value} is above this server's limit {limit}", field=field,
                           allowed=f"at most {limit} ({setting})")


def score_or_none(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def final_score(scores: dict, rank: int) -> float:
    """The score of the last stage that scored this candidate (the CE scores only the head of the list)."""
    for stage in ("ce", "cmc", "retrieve"):
        if stage in scores and not math.isnan(scores[stage][rank]):
            return float(scores[stage][rank])
    raise AssertionError("every candidate has a retrieve score")


def document_out(searcher: Searcher, outcome: Outcome) -> list[schemas.DocumentOut]:
    cands = outcome.candidates
    if cands.texts is not None:
        return [schemas.DocumentOut(id=None, text=text) for text in cands.texts]
    return [schemas.DocumentOut(id=d.id, title=d.title, text=d.text) for d in searcher.index.documents(cands.rows)]


@router.post("/search", response_model=schemas.SearchResponse, responses=ERRORS, tags=["search"])
def search(body: schemas.SearchRequest, components: ComponentsDep, settings: SettingsDep, metrics: MetricsDep):
    """Retrieve with the bi-encoder, optionally rerank with CMC and the cross-encoder, return the top_k."""
    check_limit(body.top_k, settings.max_top_k, "top_k", "SIEVE_MAX_TOP_K")
    check_limit(body.retrieve_k, settings.max_retrieve_k, "retrieve_k", "SIEVE_MAX_RETRIEVE_K")
    searcher = components.searcher
    params = SearchParams(body.query, body.top_k, body.retrieve_k, body.rerank, body.cmc_k, body.cross_encoder)
    outcome = searcher.search(params)
    metrics.observe(outcome.state.timings_ms, outcome.state.counts)
    cands = outcome.candidates
    docs = document_out(searcher, outcome) if body.return_documents else [None] * len(cands)
    hits = [
        schemas.SearchHit(
            id=doc_id, rank=rank + 1, score=final_score(cands.scores, rank),
            scores=schemas.StageScores(**{k: score_or_none(v[rank]) for k, v in cands.scores.items()}),
            document=docs[rank])
        for rank, doc_id in enumerate(searcher.index.ids(cands.rows))
    ]
    stages = ["retrieve"] + (["cmc"] if body.rerank == "cmc" else []) + (["ce"] if body.cross_encoder else [])
    return schemas.SearchResponse(results=hits, timings_ms=schemas.SearchTimings(**outcome.state.timings_ms),
                                  index_version=outcome.index_version, stages=stages, warnings=outcome.state.warnings)


def rerank_items(body: schemas.RerankRequest) -> list[RerankItem]:
    return [RerankItem(text=d) if isinstance(d, str) else RerankItem(text=d.text, id=d.id) for d in body.documents]


@router.post("/rerank", response_model=schemas.RerankResponse, responses=ERRORS, tags=["search"])
def rerank(body: schemas.RerankRequest, components: ComponentsDep, settings: SettingsDep, metrics: MetricsDep):
    """Rerank a candidate list from elsewhere (Cohere / TEI shape). Indexed ids reuse stored vectors."""
    check_limit(len(body.documents), settings.rerank_max_documents, "documents", "SIEVE_RERANK_MAX_DOCUMENTS")
    searcher = components.searcher
    items = rerank_items(body)
    outcome = searcher.rerank(body.query, items, body.model, body.top_n or len(items))
    metrics.observe(outcome.state.timings_ms, outcome.state.counts)
    cands = outcome.candidates
    results = []
    for pos, origin in enumerate(cands.origin):
        item = items[origin]
        document = schemas.DocumentOut(id=item.id, text=cands.texts[pos]) if body.return_documents else None
        results.append(schemas.RerankResult(index=int(origin), relevance_score=float(cands.scores[outcome.final_stage][pos]),
                                            document=document))
    return schemas.RerankResponse(results=results, timings_ms=outcome.state.timings_ms, model=body.model,
                                  index_version=outcome.index_version, warnings=outcome.state.warnings)


@router.get("/healthz", response_model=schemas.Health, tags=["health"])
def healthz():
    """Alive: the process answers."""
    return schemas.Health()


@router.get("/readyz", response_model=schemas.Ready, tags=["health"])
def readyz(components: ComponentsDep, settings: SettingsDep):
    """Ready: models and index are loaded."""
    index = components.searcher.index
    return schemas.Ready(index_size=index.size, index_version=index.version, index_dir=str(settings.index_dir),
                         models=components.model_names(), device=components.device)


@router.get("/metrics", tags=["health"], response_class=Response)
def metrics_endpoint(metrics: MetricsDep, components: ComponentsDep):
    """Prometheus exposition format."""
    metrics.index_size.set(components.searcher.index.size)
    metrics.index_version.set(components.searcher.index.version)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
