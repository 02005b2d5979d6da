"""The service's side of learning from users (sieve/feedback): every /search or /rerank answer gets a request id;
with SIEVE_FEEDBACK_ENABLED what it showed is recorded (off the request path: recorder.py) and POST /feedback
events against it are validated and stored durably (events.py). Optionally a small share of /search answers swap
two adjacent top results (logged), from which `sieve feedback learn` estimates position bias, and a small share
explore: a few of the shown positions go to candidates drawn at random from deeper in the served ranking (logged),
so that clicks can vouch for documents the ranking does not show yet (the click memory counts every shown document:
training/memory_learn.py). With SIEVE_FEEDBACK_EXPLORE_FROM=neighbours those candidates are first the ones users of
similar queries clicked (feedback/neighbours.py), from anywhere below the shown results."""
from __future__ import annotations

import logging
import random
import threading

import numpy as np

from sieve.feedback.events import FeedbackStore
from sieve.feedback.log import Tail
from sieve.feedback.neighbours import ClickNeighbours
from sieve.feedback.recorder import ImpressionRecorder
from sieve.service import schemas

log = logging.getLogger("sieve")
MB = 1024 * 1024
CATCH_UP_S = 1.0  # neighbours: how often the clicks every worker logged since are read
LEADS_PER_SLOT = 4  # neighbours: a slot is drawn among the (up to) 4 x slots candidates similar queries' clicks promote most


class FeedbackService:
    def __init__(self, settings):
        root = settings.feedback_path()
        retention = int(settings.feedback_retention_mb * MB)
        explores = settings.feedback_explore_fraction > 0
        self.neighbours = ClickNeighbours(settings.feedback_explore_clicks, settings.feedback_explore_near) \
            if explores and settings.feedback_explore_from == "neighbours" else None
        self.recorder = ImpressionRecorder(root, retention, settings.feedback_log_candidates,
                                           settings.feedback_log_query_text, settings.feedback_memory,
                                           keep_vectors=self.neighbours is not None)
        self.store = FeedbackStore(root, self.recorder, retention)
        self.swap_fraction, self.swap_depth = settings.feedback_swap_fraction, settings.feedback_swap_depth
        self.explore_fraction = settings.feedback_explore_fraction
        self.explore_depth, self.explore_slots = settings.feedback_explore_depth, settings.feedback_explore_slots
        self.rng = random.Random()
        self.stopped = threading.Event()
        self.follower = None
        if self.neighbours is not None:
            self.clicks = Tail(self.store.log)  # the events log, followed for the neighbours' clicks
            self.follower = threading.Thread(target=self.follow, name="sieve-explore-clicks", daemon=True)
            self.follower.start()

    def pick_explore(self) -> bool:
        """Whether this /search answer explores: drawn before the result cache is read (a cached answer has no
        ranking below its top_k to draw from, so an exploring one is computed)."""
        return bool(self.explore_fraction) and self.rng.random() < self.explore_fraction

    def on_search(self, request_id: str, query: str, response: schemas.SearchResponse, outcome=None,
                  explore: bool = False):
        """Record what the answer shows (after exploration or a randomised swap, if this answer gets one; never
        both); returns the answer."""
        explored = self.explored(response, outcome) if explore and outcome is not None else None
        swap = None
        if explored is not None:
            response, explored = explored
        else:
            swap = self.pick_swap(len(response.results))
            if swap is not None:
                response = swapped(response, swap)
        self.recorder.record(request_id, "/search", query, [h.id for h in response.results], outcome, swap,
                             explored)
        return response

    def explored(self, response: schemas.SearchResponse, outcome) -> tuple[schemas.SearchResponse, list] | None:
        """The answer with `explore_slots` positions (uniform among the shown ones) given to candidates from below
        them: first those similar queries' users clicked (`led`, with neighbours), the rest drawn uniformly from
        the served ranking's ranks down to `explore_depth`; and [[position, served rank], ...] (1-based) for the
        log; None when there is nothing deeper."""
        cands, n = outcome.state.candidates, len(response.results)
        deep = range(n, min(self.explore_depth, len(cands)))  # 0-based served ranks below the shown ones
        k = min(self.explore_slots, n, len(deep))
        if k < 1 or cands is None or (cands.ids is None and (cands.rows < 0).any()):
            return None
        positions = sorted(self.rng.sample(range(1, n + 1), k))
        picks = self.led(outcome, cands, n, k)
        picks += self.rng.sample([r for r in deep if r not in picks], k - len(picks))
        extra = deeper_hits(cands.take(np.array(picks)), outcome.index, response.results[0].document is not None)
        return inserted(response, positions, extra), [[p, r + 1] for p, r in zip(positions, picks)]

    def follow(self) -> None:
        """The neighbours' feed, in a thread of its own (off the request path): every CATCH_UP_S, the clicks every
        worker logged since (the events log on disk, from its oldest segment at start-up), each with its answer's
        query vector (kept for the latest answers: recorder.VECTORS_KEPT)."""
        while not self.stopped.wait(CATCH_UP_S):
            try:
                self.catch_up()
            except Exception:  # noqa: BLE001 - exploration falls back to ranks; the next round tries again
                log.exception("could not read the clicks for exploration")

    def catch_up(self) -> None:
        for event in self.clicks.new():
            if event.get("type", "click") == "click" or (event.get("label") or 0) > 0:
                vector = self.recorder.vector(event["request_id"])
                if vector is not None:
                    self.neighbours.add(vector, event["doc_id"])

    def led(self, outcome, cands, n: int, k: int) -> list[int]:
        """Up to k served ranks (0-based, below the n shown) of candidates users of similar queries clicked, drawn
        among the LEADS_PER_SLOT x k they promote most (neighbours.py); [] without neighbours."""
        if self.neighbours is None or len(cands) <= n:
            return []
        vectors = outcome.state.query_vectors
        vector = vectors.get("cmc", vectors.get("be"))
        if vector is None:
            return []
        ids = cands.ids if cands.ids is not None else outcome.index.ids(cands.rows)
        weight = self.neighbours.promoted(vector.detach().float().cpu().numpy(), list(ids[n:]))
        lead = np.flatnonzero(weight > 0)
        lead = lead[np.argsort(-weight[lead], kind="stable")][:LEADS_PER_SLOT * k]
        return [n + int(r) for r in self.rng.sample(list(lead), min(k, len(lead)))]

    def on_rerank(self, request_id: str, query: str, response: schemas.RerankResponse, items) -> None:
        shown = [items[r.index].id for r in response.results if items[r.index].id is not None]
        self.recorder.record(request_id, "/rerank", query, shown)

    def pick_swap(self, n: int) -> int | None:
        if not self.swap_fraction or n < 2 or self.rng.random() >= self.swap_fraction:
            return None
        return self.rng.randint(1, min(self.swap_depth, n) - 1)  # positions p and p + 1 (1-based)

    def close(self) -> None:
        self.stopped.set()
        if self.follower is not None:
            self.follower.join(timeout=5)
        self.store.close()


def deeper_hits(cands, index, with_documents: bool) -> list[schemas.SearchHit]:
    ids = cands.ids if cands.ids is not None else index.ids(cands.rows)
    docs = [schemas.DocumentOut.model_construct(id=d.id, title=d.title, text=d.text)
            for d in index.documents(cands.rows)] if with_documents else [None] * len(cands)
    columns = {k: [None if np.isnan(x) else float(x) for x in v] for k, v in cands.scores.items()}
    return [schemas.SearchHit.model_construct(id=doc_id, rank=0, score=None, document=docs[i],
                                              scores={k: c[i] for k, c in columns.items()})
            for i, doc_id in enumerate(ids)]


def inserted(response: schemas.SearchResponse, positions: list[int], extra: list) -> schemas.SearchResponse:
    """`extra` shown at `positions` (1-based, ascending), the answer's own results in order in the other positions
    (its last len(extra) no longer shown); rank and score stay with the position (score never increases)."""
    first = positions[0]
    own, extra, hits = iter(response.results[first - 1:]), iter(extra), list(response.results[:first - 1])
    for position, slot in enumerate(response.results[first - 1:], first):  # the ones above stay as they were
        hit = next(extra) if position in positions else next(own)
        hits.append(schemas.SearchHit.model_construct(id=hit.id, rank=slot.rank, score=slot.score, scores=hit.scores,
                                                      document=hit.document))
    return response.model_copy(update={"results": hits})


def swapped(response: schemas.SearchResponse, p: int) -> schemas.SearchResponse:
    """Results p and p+1 (1-based) trade places; rank and score stay with the position (score never increases)."""
    hits = list(response.results)
    a, b = hits[p - 1], hits[p]
    hits[p - 1] = schemas.SearchHit.model_construct(id=b.id, rank=a.rank, score=a.score, scores=b.scores,
                                                    document=b.document)
    hits[p] = schemas.SearchHit.model_construct(id=a.id, rank=b.rank, score=b.score, scores=a.scores,
                                                document=a.document)
    return response.model_copy(update={"results": hits})
