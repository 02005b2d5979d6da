"""Pipeline outcomes -> response bodies (kept out of the handlers so they stay thin)."""
from __future__ import annotations

import math
import uuid

import numpy as np
from fastapi.responses import Response
from pydantic import BaseModel

from sieve.pipeline.candidates import ranked_scores  # noqa: F401 (the answers' `score`)
from sieve.pipeline.searcher import Outcome
from sieve.service import schemas


def score_or_none(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def documents_out(outcome: Outcome) -> list[schemas.DocumentOut]:
    cands = outcome.candidates
    if cands.texts is not None:
        return [schemas.DocumentOut.model_construct(id=None, text=text) for text in cands.texts]
    return [schemas.DocumentOut.model_construct(id=d.id, title=d.title, text=d.text)
            for d in outcome.index.documents(cands.rows)]


def search_response(outcome: Outcome, return_documents: bool, request_id: str | None = None) -> schemas.SearchResponse:
    """Built with model_construct: every value is typed here (Python str, int, float, None), so validating it again
    would only cost time; tests/service/test_ranked_scores.py checks the result against the schema."""
    cands, state = outcome.candidates, outcome.state
    docs = documents_out(outcome) if return_documents else [None] * len(cands)
    ranked = ranked_scores(cands.scores).tolist() if len(cands) else []
    columns = {k: [None if math.isnan(x) else x for x in v.tolist()] for k, v in cands.scores.items()}
    hits = [
        schemas.SearchHit.model_construct(id=doc_id, rank=rank + 1, score=ranked[rank],
                                          scores={k: c[rank] for k, c in columns.items()}, document=docs[rank])
        for rank, doc_id in enumerate(cands.ids if cands.ids is not None else outcome.index.ids(cands.rows))
    ]
    return schemas.SearchResponse.model_construct(results=hits, timings_ms=dict(state.timings_ms),
                                                  index_version=int(outcome.index_version), stages=list(state.ran),
                                                  warnings=list(state.warnings), partial=bool(state.partial),
                                                  skipped=list(state.skipped), request_id=request_id)


def json_response(reply: BaseModel, exclude: set[str] | None = None) -> Response:
    """The answer serialised once, by its schema's own serializer: returned as a Response, FastAPI neither validates
    it again nor hands it to another thread to serialise."""
    return Response(to_json(reply, exclude), media_type="application/json")


def to_json(reply: BaseModel, exclude: set[str] | None = None) -> bytes:
    return type(reply).__pydantic_serializer__.to_json(reply, exclude=exclude)


def rerank_response(outcome: Outcome, items, model: str, return_documents: bool,
                    request_id: str | None = None) -> schemas.RerankResponse:
    cands, state = outcome.candidates, outcome.state
    column = cands.scores.get(outcome.final_stage)
    ranked = None if column is None or not len(cands) else ranked_scores(cands.scores)
    results = []
    for pos, origin in enumerate(cands.origin):
        document = schemas.DocumentOut(id=items[origin].id, text=cands.texts[pos]) if return_documents else None
        score = None if ranked is None else score_or_none(ranked[pos])
        results.append(schemas.RerankResult(index=int(origin), relevance_score=score, document=document))
    return schemas.RerankResponse(results=results, timings_ms=state.timings_ms, model=model,
                                  index_version=outcome.index_version, warnings=state.warnings,
                                  partial=state.partial, skipped=list(state.skipped), request_id=request_id)


def cohere_rerank_response(outcome: Outcome, n_documents: int) -> schemas.CohereRerankResponse:
    """Cohere v2 shape; what Sieve's /rerank says in `partial`/`skipped` goes to meta.warnings."""
    reply = rerank_response(outcome, [None] * n_documents, outcome.final_stage, return_documents=False)
    warnings = list(reply.warnings)
    if reply.partial:
        warnings.append(f"partial: skipped {', '.join(reply.skipped)} for lack of time; the fallback order is returned")
    results = [schemas.CohereRerankResult(index=r.index, relevance_score=r.relevance_score) for r in reply.results]
    meta = schemas.CohereMeta(billed_units=schemas.CohereBilledUnits(search_units=-(-n_documents // 100)),
                              warnings=warnings)
    return schemas.CohereRerankResponse(id=str(uuid.uuid4()), results=results, meta=meta)
