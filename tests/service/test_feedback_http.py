"""POST /feedback against a real `sieve serve`: request ids on answers, validation (unknown request id, a document
not shown, an oversized batch: clear 4xx), and durability (a server SIGKILLed right after acknowledging events
has every one of them, with its impression, on disk after the restart)."""
from __future__ import annotations

import shutil

import pytest

from sieve.feedback.log import read_records
from tests.server import Server


@pytest.fixture(scope="module")
def feedback_server(demo_index, tmp_path_factory):
    index = tmp_path_factory.mktemp("fb") / "index"
    shutil.copytree(demo_index, index)
    srv = Server({"SIEVE_INDEX_DIR": str(index), "SIEVE_FEEDBACK_ENABLED": "true", "SIEVE_FEEDBACK_MAX_EVENTS": "5",
                  "SIEVE_FEEDBACK_LOG_QUERY_TEXT": "true"},
                 tmp_path_factory.mktemp("logs") / "fb-server.log")
    yield srv, index
    srv.stop()


def search(client, query="how do volcanoes erupt", top_k=5) -> dict:
    r = client.post("/search", json={"query": query, "top_k": top_k})
    assert r.status_code == 200, r.text
    return r.json()


def test_answers_carry_request_ids_and_clicks_are_stored(feedback_server):
    srv, index = feedback_server
    with srv.client() as c:
        a, b = search(c), search(c)  # the second from the result cache: a request id of its own all the same
        assert a["request_id"] and b["request_id"] and a["request_id"] != b["request_id"] and b["cached"]
        rerank = c.post("/rerank", json={"query": "bread", "documents": [{"id": a["results"][0]["id"]}]}).json()
        assert rerank["request_id"]
        clicked = a["results"][2]["id"]
        r = c.post("/feedback", json={"events": [{"request_id": a["request_id"], "doc_id": clicked, "dwell_ms": 4000},
                                                 {"request_id": b["request_id"], "doc_id": b["results"][0]["id"],
                                                  "type": "label", "label": 2}]})
        assert r.status_code == 200, r.text
        assert r.json() == {"accepted": 2}
    events = list(read_records(index / "feedback", "events"))
    assert [(e["request_id"], e["doc_id"]) for e in events][-2:] == [(a["request_id"], clicked),
                                                                       (b["request_id"], b["results"][0]["id"])]
    shown = {i["request_id"]: i for i in read_records(index / "feedback", "impressions")}
    assert shown[a["request_id"]]["shown"] == [h["id"] for h in a["results"]]
    assert shown[a["request_id"]]["query"] == "how do volcanoes erupt"
    assert len(shown[a["request_id"]]["candidates"]) > 5 and "vector" in shown[a["request_id"]]
    assert "candidates" not in shown[b["request_id"]]  # a cached answer: the learner joins it by query_key
    assert shown[b["request_id"]]["query_key"] == shown[a["request_id"]]["query_key"]


@pytest.mark.parametrize("event, status, code, field", [
    ({"request_id": "0" * 32, "doc_id": "x"}, 404, "unknown_request_id", "events.0.request_id"),
    ({"doc_id": "not-shown"}, 422, "document_not_shown", "events.0.doc_id"),
    ({"doc_id": None}, 422, "validation_error", "events.0.doc_id"),
])
def test_bad_events_are_clear_4xx(feedback_server, event, status, code, field):
    srv, _ = feedback_server
    with srv.client() as c:
        answer = search(c, "baking bread", top_k=3)
        event = {"request_id": answer["request_id"], **event}
        r = c.post("/feedback", json={"events": [event]})
        assert r.status_code == status, r.text
        assert (r.json()["error"]["code"], r.json()["error"]["field"]) == (code, field)  # paths as documented


def test_oversized_batch_is_413(feedback_server):
    srv, _ = feedback_server
    with srv.client() as c:
        answer = search(c, "roman legions", top_k=3)
        events = [{"request_id": answer["request_id"], "doc_id": answer["results"][0]["id"]}] * 6
        r = c.post("/feedback", json={"events": events})
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "too_many_events"
        assert "SIEVE_FEEDBACK_MAX_EVENTS" in r.json()["error"]["allowed"]


def test_acknowledged_events_survive_sigkill(demo_index, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(demo_index, index)
    env = {"SIEVE_INDEX_DIR": str(index), "SIEVE_FEEDBACK_ENABLED": "true"}
    srv = Server(env, tmp_path / "a.log")
    acknowledged = []
    try:
        with srv.client() as c:
            for i in range(20):
                answer = search(c, f"volcano eruption lava {i}", top_k=4)
                events = [{"request_id": answer["request_id"], "doc_id": h["id"]} for h in answer["results"][:2]]
                r = c.post("/feedback", json={"events": events})
                assert r.status_code == 200, r.text
                acknowledged += [(e["request_id"], e["doc_id"]) for e in events]
        srv.proc.kill()  # SIGKILL right after the last acknowledgement: nothing is flushed on the way out
        srv.proc.wait(timeout=20)
    finally:
        srv.log.close()
    stored = {(e["request_id"], e["doc_id"]) for e in read_records(index / "feedback", "events")}
    assert not [a for a in acknowledged if a not in stored]
    impressions = {i["request_id"] for i in read_records(index / "feedback", "impressions")}
    assert {rid for rid, _ in acknowledged} <= impressions
    again = Server(env, tmp_path / "b.log")  # the restarted server still knows the old answers (read from disk)
    try:
        with again.client() as c:
            rid, doc = acknowledged[0]
            r = c.post("/feedback", json={"events": [{"request_id": rid, "doc_id": doc}]})
            assert r.status_code == 200, r.text
    finally:
        again.stop()
