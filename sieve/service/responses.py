"""Pipeline outcomes -> response bodies (kept out of the handlers so they stay thin)."""
from __future__ import annotations

import math
import uuid

import numpy as np
import pydantic_core
from fastapi.responses import Response
from pydantic import BaseModel

from sieve.pipeline.candidates import ranked_scores  # noqa: F401 (the answers' `score`)
from sieve.pipeline.searcher import Outcome
from sieve.service import schemas


def score_or_none(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def documents_out(outcome: Outcome) -> list[dict]:
    """Each candidate's document as schemas.DocumentOut's fields, in its order."""
    cands = outcome.candidates
    if cands.texts is not None:
        return [{"id": None, "title": None, "text": text} for text in cands.texts]
    return [{"id": d.id, "title": d.title, "text": d.text} for d in outcome.index.documents(cands.rows)]


def search_body(outcome: Outcome, return_documents: bool, request_id: str | None = None) -> dict:
    """The /search answer as plain values, keys in schemas.SearchResponse's order: what `body_json` serialises as the
    schema does (tests/service/test_ranked_scores.py compares the bytes), at about 0.4x the CPU of building the
    eleven models and serialising them (40 against 100 us for ten hits: RESULTS.md, issue 32, fourteenth session)."""
    cands, state = outcome.candidates, outcome.state
    docs = documents_out(outcome) if return_documents else [None] * len(cands)
    ranked = ranked_scores(cands.scores).tolist() if len(cands) else []
    columns = {k: [None if math.isnan(x) else x for x in v.tolist()] for k, v in cands.scores.items()}
    hits = [{"id": doc_id, "rank": rank + 1, "score": ranked[rank],
             "scores": {k: c[rank] for k, c in columns.items()}, "document": docs[rank]}
            for rank, doc_id in enumerate(cands.ids if cands.ids is not None else outcome.index.ids(cands.rows))]
    return {"results": hits, "timings_ms": dict(state.timings_ms), "index_version": int(outcome.index_version),
            "stages": list(state.ran), "warnings": list(state.warnings), "partial": bool(state.partial),
            "skipped": list(state.skipped), "cached": False, "request_id": request_id}


def body_json(body: dict) -> bytes:
    """A `search_body` serialised: NaN and infinities as null, as the response models serialise them."""
    return pydantic_core.to_json(body, inf_nan_mode="null")


def response_model(body: dict) -> schemas.SearchResponse:
    """A `search_body` as the response model (what feedback's exploration and swaps edit). Built with model_construct:
    every value is typed there (Python str, int, float, None), so validating it again would only cost time."""
    def document(doc: dict | None):
        return None if doc is None else schemas.DocumentOut.model_construct(**doc)

    hits = [schemas.SearchHit.model_construct(**{**hit, "document": document(hit["document"])}) for hit in body["results"]]
    return schemas.SearchResponse.model_construct(**{**body, "results": hits})


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
