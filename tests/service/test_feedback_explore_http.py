"""Exploration (SIEVE_FEEDBACK_EXPLORE_FRACTION) against a real `sieve serve`: an exploring answer shows candidates
from deeper in the served ranking at logged positions, keeps its own results in order elsewhere, rank and score
with the position, is never read from the result cache, accepts clicks on what it explored; the learner's position-
bias estimate leaves exploring answers out; with the fraction at 0 nothing explores."""
from __future__ import annotations

import random
import shutil
import time
from types import SimpleNamespace

import pytest

from sieve.feedback.dataset import Logs
from sieve.feedback.log import read_records
from sieve.service.feedback_service import FeedbackService
from tests.server import Server

QUERY = "how do volcanoes erupt"


@pytest.fixture(scope="module")
def exploring(demo_index, tmp_path_factory):
    index = tmp_path_factory.mktemp("explore") / "index"
    shutil.copytree(demo_index, index)
    srv = Server({"SIEVE_INDEX_DIR": str(index), "SIEVE_FEEDBACK_ENABLED": "true",
                  "SIEVE_FEEDBACK_EXPLORE_FRACTION": "1", "SIEVE_FEEDBACK_EXPLORE_DEPTH": "20",
                  "SIEVE_FEEDBACK_EXPLORE_SLOTS": "2"}, tmp_path_factory.mktemp("logs") / "explore-server.log")
    yield srv, index
    srv.stop()


def test_exploring_answers_show_deeper_candidates_at_logged_positions(exploring):
    srv, index = exploring
    with srv.client() as c:
        # top_k 20 = the explore depth: nothing deeper to draw from, so this answer is the served ranking itself
        served = c.post("/search", json={"query": QUERY, "top_k": 20}).json()["results"]
        answers = [c.post("/search", json={"query": QUERY, "top_k": 5}).json() for _ in range(12)]
        assert not any(a["cached"] for a in answers)  # an exploring answer is computed, never read from the cache
        explored_id, impressions, srv_ids = None, {}, [h["id"] for h in served]
        for _ in range(50):  # the impressions are written off the request path
            impressions = {r["request_id"]: r for r in read_records(index / "feedback", "impressions")}
            if all(a["request_id"] in impressions for a in answers):
                break
            time.sleep(0.1)
        seen_ranks = set()
        for a in answers:
            imp = impressions[a["request_id"]]
            shown = [h["id"] for h in a["results"]]
            assert imp["shown"] == shown and imp["swap"] is None
            explore = imp["explore"]
            assert len(explore) == 2 and explore[0][0] < explore[1][0]
            positions = [p for p, _ in explore]
            own = iter(srv_ids[:5])
            for position, hit in enumerate(a["results"], 1):
                assert hit["rank"] == served[position - 1]["rank"] == position
                assert hit["score"] == pytest.approx(served[position - 1]["score"])  # score stays with the position
                if position in positions:
                    rank = dict(explore)[position]
                    assert 6 <= rank <= 20 and hit["id"] == srv_ids[rank - 1]
                    seen_ranks.add(rank)
                    explored_id = explored_id or (a["request_id"], hit["id"])
                else:
                    assert hit["id"] == next(own)  # the answer's own results, in order, the last two left out
        assert len(seen_ranks) > 2  # drawn at random, not always the same ranks
        r = c.post("/feedback", json={"events": [{"request_id": explored_id[0], "doc_id": explored_id[1]}]})
        assert r.status_code == 200, r.text
    logs = Logs.read(index / "feedback")
    counted = list(logs.for_propensity())
    assert len(counted) == len(logs.impressions) - len(answers)  # exploring answers left out of the estimate
    clicked = [a for a in logs.answers() if a.clicked]
    assert explored_id[1] in clicked[-1].clicked  # the click memory counts a click on an explored document


def test_nothing_explores_at_fraction_zero():
    service = SimpleNamespace(explore_fraction=0.0, rng=random.Random(0))
    assert not any(FeedbackService.pick_explore(service) for _ in range(1000))
    service.explore_fraction = 0.25
    share = sum(FeedbackService.pick_explore(service) for _ in range(4000)) / 4000
    assert 0.2 < share < 0.3


@pytest.fixture(scope="module")
def led(demo_index, tmp_path_factory):
    index = tmp_path_factory.mktemp("explore-led") / "index"
    shutil.copytree(demo_index, index)
    srv = Server({"SIEVE_INDEX_DIR": str(index), "SIEVE_FEEDBACK_ENABLED": "true", "SIEVE_CACHE_ENABLED": "false",
                  "SIEVE_FEEDBACK_EXPLORE_FRACTION": "1", "SIEVE_FEEDBACK_EXPLORE_DEPTH": "7",
                  "SIEVE_FEEDBACK_EXPLORE_SLOTS": "2", "SIEVE_FEEDBACK_EXPLORE_FROM": "neighbours",
                  "SIEVE_FEEDBACK_EXPLORE_NEAR": "0.8", "SIEVE_WORKERS": "1"}, tmp_path_factory.mktemp("logs") / "explore-led-server.log")
    yield srv, index
    srv.stop()


def explored_ids(index, answers) -> list[list[tuple[int, str]]]:
    """Each answer's explored (served rank, id) pairs, from its impression."""
    for _ in range(50):  # the impressions are written off the request path
        impressions = {r["request_id"]: r for r in read_records(index / "feedback", "impressions")}
        if all(a["request_id"] in impressions for a in answers):
            break
        time.sleep(0.1)
    out = []
    for a in answers:
        shown = {position: h["id"] for position, h in enumerate(a["results"], 1)}
        out.append([(rank, shown[position]) for position, rank in impressions[a["request_id"]].get("explore", [])])
    return out


def test_exploration_shows_what_similar_queries_users_clicked(led):
    """A document deep in one query's ranking (far below the explore depth), clicked by the user of a similar query,
    fills an exploring slot of every later answer to the first query, at its served rank (logged); the other slot
    is drawn from the ranks as before; a query unlike the clicking one gets no such document."""
    srv, index = led
    query, similar, unlike = "how do volcanoes erupt", "why do volcanoes erupt", "a sourdough starter for bread"
    with srv.client() as c:
        every = lambda q: c.post("/search", json={"query": q, "top_k": 60}).json()  # noqa: E731 - nothing deeper
        served = [h["id"] for h in every(query)["results"]]
        clicked_by = every(similar)  # shows every document: the click can be on any
        target = served[29]  # rank 30 of the query: uniform exploration (ranks 6-7) never shows it
        assert explored_ids(index, [clicked_by]) == [[]]
        r = c.post("/feedback", json={"events": [{"request_id": clicked_by["request_id"], "doc_id": target}]})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 30  # the clicks are read from the events log off the request path, once a second
        while time.monotonic() < deadline:
            first = c.post("/search", json={"query": query, "top_k": 5}).json()
            if (30, target) in explored_ids(index, [first])[0]:
                break
            time.sleep(0.2)
        answers = [c.post("/search", json={"query": query, "top_k": 5}).json() for _ in range(6)]
        others = [c.post("/search", json={"query": unlike, "top_k": 5}).json() for _ in range(6)]
    for pairs in explored_ids(index, answers):
        assert (30, target) in pairs and len(pairs) == 2
        assert [rank for rank, _ in pairs if rank != 30][0] in (6, 7)
    for pairs in explored_ids(index, others):
        assert len(pairs) == 2 and all(rank in (6, 7) for rank, _ in pairs)
