"""Feedback events (clicks, dwell, explicit labels) against the impression a request id names: validated, then
appended to the events log (log.py: fsynced before POST /feedback answers), each stamped with the time received."""
from __future__ import annotations

import time
from pathlib import Path

from sieve.feedback.log import AppendLog
from sieve.feedback.recorder import ImpressionRecorder
from sieve.pipeline.errors import RequestError


class UnknownRequest(RequestError):
    status_code = 404
    code = "unknown_request_id"


class NotShown(RequestError):
    status_code = 422
    code = "document_not_shown"


class NotStored(RequestError):
    status_code = 503
    code = "feedback_unavailable"


class FeedbackStore:
    def __init__(self, root: Path, recorder: ImpressionRecorder, retention_bytes: int):
        self.recorder = recorder
        self.log = AppendLog(root, "events", retention_bytes)

    def check(self, events: list[dict]) -> None:
        """Every event names a request this server answered and a document that answer showed (4xx otherwise)."""
        shown: dict[str, tuple[str, ...] | None] = {}
        for i, event in enumerate(events):
            rid = event["request_id"]
            if rid not in shown:
                shown[rid] = self.recorder.shown_ids(rid)
            if shown[rid] is None:
                raise UnknownRequest(f"events[{i}]: no answer of this server has request_id {rid!r}",
                                     field=f"events.{i}.request_id",
                                     allowed="the request_id of a /search or /rerank answer within the retention")
            if event["doc_id"] not in shown[rid]:
                raise NotShown(f"events[{i}]: document {event['doc_id']!r} was not shown in answer {rid!r}",
                               field=f"events.{i}.doc_id", allowed="an id among that answer's results")

    def append(self, events: list[dict]) -> int:
        """Validate, wait for the impressions named to be on disk, append and fsync: returns how many stored."""
        self.check(events)
        for rid in {e["request_id"] for e in events}:
            if not self.recorder.durable(rid):
                raise NotStored("the impression this event refers to could not be stored yet; retry",
                                field="events", allowed="a retry")
        now = round(time.time(), 3)
        return self.log.append([{**e, "received": now} for e in events])

    def close(self) -> None:
        self.log.close()
        self.recorder.close()
