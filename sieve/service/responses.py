"""Pipeline outcomes -> response bodies (kept out of the handlers so they stay thin)."""
from __future__ import annotations

import math
import uuid

from sieve.pipeline import registry
from sieve.pipeline.searcher import Outcome
from sieve.service import schemas


def score_or_none(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def final_score(scores: dict, rank: int) -> float:
    """The score of the last stage that scored this candidate (the CE scores only the head of the list): columns
    are in the order the stages added them, and each stage ranks by the first column it declares."""
    for column in reversed([c for c in scores if c in registry.ranking_keys()]):
        if not math.isnan(scores[column][rank]):
            return float(scores[column][rank])
    raise AssertionError("every candidate has a retrieve score")


def documents_out(outcome: Outcome) -> list[schemas.DocumentOut]:
    cands = outcome.candidates
    if cands.texts is not None:
        return [schemas.DocumentOut(id=None, text=text) for text in cands.texts]
    return [schemas.DocumentOut(id=d.id, title=d.title, text=d.text) for d in outcome.index.documents(cands.rows)]


def search_response(outcome: Outcome, return_documents: bool) -> schemas.SearchResponse:
    cands, state = outcome.candidates, outcome.state
    docs = documents_out(outcome) if return_documents else [None] * len(cands)
    hits = [
        schemas.SearchHit(
            id=doc_id, rank=rank + 1, score=final_score(cands.scores, rank),
            scores={k: score_or_none(v[rank]) for k, v in cands.scores.items()},
            document=docs[rank])
        for rank, doc_id in enumerate(cands.ids if cands.ids is not None else outcome.index.ids(cands.rows))
    ]
    return schemas.SearchResponse(results=hits, timings_ms=dict(state.timings_ms),
                                  index_version=outcome.index_version, stages=list(state.ran),
                                  warnings=state.warnings, partial=state.partial, skipped=list(state.skipped))


def rerank_response(outcome: Outcome, items, model: str, return_documents: bool) -> schemas.RerankResponse:
    cands, state = outcome.candidates, outcome.state
    column = cands.scores.get(outcome.final_stage)
    results = []
    for pos, origin in enumerate(cands.origin):
        document = schemas.DocumentOut(id=items[origin].id, text=cands.texts[pos]) if return_documents else None
        score = None if column is None else score_or_none(column[pos])
        results.append(schemas.RerankResult(index=int(origin), relevance_score=score, document=document))
    return schemas.RerankResponse(results=results, timings_ms=state.timings_ms, model=model,
                                  index_version=outcome.index_version, warnings=state.warnings,
                                  partial=state.partial, skipped=list(state.skipped))


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
