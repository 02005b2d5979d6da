"""POST /feedback: click / label events against an answer's request id (thin handler over sieve/feedback)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from sieve.pipeline.errors import RequestError
from sieve.service import schemas
from sieve.service.routes import ERRORS, Guarded, SettingsDep

router = APIRouter()
FEEDBACK_ERRORS = {**ERRORS, **{code: {"model": schemas.ErrorResponse} for code in (404, 503)}}


class FeedbackDisabled(RequestError):
    status_code = 404
    code = "feedback_disabled"


class TooManyEvents(RequestError):
    status_code = 413
    code = "too_many_events"


@router.post("/feedback", response_model=schemas.FeedbackResponse, responses=FEEDBACK_ERRORS, tags=["feedback"],
             dependencies=Guarded)
async def feedback(body: schemas.FeedbackRequest, request: Request, settings: SettingsDep):
    """Store events (clicks, explicit labels) about the results of an answer, named by its `request_id`. 404: an
    unknown request id; 422: a document that answer did not show; 413: more than SIEVE_FEEDBACK_MAX_EVENTS events.
    Acknowledged = fsynced on disk, with the impression it refers to."""
    service = request.app.state.feedback
    if service is None:
        raise FeedbackDisabled("this server does not take feedback", field="events",
                               allowed="a server started with SIEVE_FEEDBACK_ENABLED=true")
    if len(body.events) > settings.feedback_max_events:
        raise TooManyEvents(f"{len(body.events)} events is above this server's limit {settings.feedback_max_events}",
                            field="events", allowed=f"at most {settings.feedback_max_events} (SIEVE_FEEDBACK_MAX_EVENTS)")
    events = [e.model_dump(exclude_none=True) for e in body.events]
    accepted = await run_in_threadpool(service.store.append, events)  # fsync: not on the event loop
    return schemas.FeedbackResponse(accepted=accepted)
