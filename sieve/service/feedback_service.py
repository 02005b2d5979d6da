"""The service's side of learning from users (sieve/feedback): every /search or /rerank answer gets a request id;
with SIEVE_FEEDBACK_ENABLED what it showed is recorded (off the request path: recorder.py) and POST /feedback
events against it are validated and stored durably (events.py). Optionally a small share of /search answers swap
two adjacent top results (logged), from which `sieve feedback learn` estimates position bias."""
from __future__ import annotations

import random

from sieve.feedback.events import FeedbackStore
from sieve.feedback.recorder import ImpressionRecorder
from sieve.service import schemas

MB = 1024 * 1024


class FeedbackService:
    def __init__(self, settings):
        root = settings.feedback_path()
        retention = int(settings.feedback_retention_mb * MB)
        self.recorder = ImpressionRecorder(root, retention, settings.feedback_log_candidates,
                                           settings.feedback_log_query_text, settings.feedback_memory)
        self.store = FeedbackStore(root, self.recorder, retention)
        self.swap_fraction, self.swap_depth = settings.feedback_swap_fraction, settings.feedback_swap_depth
        self.rng = random.Random()

    def on_search(self, request_id: str, query: str, response: schemas.SearchResponse, outcome=None):
        """Record what the answer shows (after a randomised swap, if this answer gets one); returns the answer."""
        swap = self.pick_swap(len(response.results))
        if swap is not None:
            response = swapped(response, swap)
        self.recorder.record(request_id, "/search", query, [h.id for h in response.results], outcome, swap)
        return response

    def on_rerank(self, request_id: str, query: str, response: schemas.RerankResponse, items) -> None:
        shown = [items[r.index].id for r in response.results if items[r.index].id is not None]
        self.recorder.record(request_id, "/rerank", query, shown)

    def pick_swap(self, n: int) -> int | None:
        if not self.swap_fraction or n < 2 or self.rng.random() >= self.swap_fraction:
            return None
        return self.rng.randint(1, min(self.swap_depth, n) - 1)  # positions p and p + 1 (1-based)

    def close(self) -> None:
        self.store.close()


def swapped(response: schemas.SearchResponse, p: int) -> schemas.SearchResponse:
    """Results p and p+1 (1-based) trade places; rank and score stay with the position (score never increases)."""
    hits = list(response.results)
    a, b = hits[p - 1], hits[p]
    hits[p - 1] = schemas.SearchHit.model_construct(id=b.id, rank=a.rank, score=a.score, scores=b.scores,
                                                    document=b.document)
    hits[p] = schemas.SearchHit.model_construct(id=a.id, rank=b.rank, score=b.score, scores=a.scores,
                                                document=a.document)
    return response.model_copy(update={"results": hits})
