"""The click memory end to end on a real server: users who always click the 4th result of their query, POST
/feedback, `sieve feedback learn --learn memory` on the logs, and the published memory picked up live (POST
/admin/index/reload) while searches keep arriving: none fails, the clicked document now leads its query's answer and
the document shown first and never clicked fell, `score` still never increases, and the result cache does not serve
the answer it stored before the publication."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

from sieve.index import read_beir_corpus
from tests.conftest import DEMO_CORPUS
from tests.server import REPO, Server

CLICKED_RANK = 4


def test_click_memory_learned_published_and_served_live(demo_index, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(demo_index, index)
    queries = [d.title for d in read_beir_corpus(DEMO_CORPUS)[:12]]
    srv = Server({"SIEVE_INDEX_DIR": str(index), "SIEVE_FEEDBACK_ENABLED": "true", "SIEVE_CMC_PATH": ""},
                 tmp_path / "server.log", shipped_models=True)
    try:
        before = {}
        with srv.client() as c:
            for _ in range(10):
                for q in queries:
                    answer = c.post("/search", json={"query": q, "top_k": 10}).json()
                    before[q] = [h["id"] for h in answer["results"]]
                    event = {"request_id": answer["request_id"], "doc_id": before[q][CLICKED_RANK - 1]}
                    assert c.post("/feedback", json={"events": [event]}).status_code == 200
            assert c.post("/search", json={"query": queries[0], "top_k": 10}).json()["cached"] is True
            assert c.get("/readyz").json()["click_memory"] is None

        failures, stop = [], threading.Event()

        def load():
            with srv.client() as client:
                while not stop.is_set():
                    r = client.post("/search", json={"query": queries[1], "top_k": 5},
                                    headers={"Cache-Control": "no-cache"})
                    if r.status_code != 200:
                        failures.append(r.status_code)

        threads = [threading.Thread(target=load) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            learned = subprocess.run([sys.executable, "-m", "sieve.cli", "feedback", "learn", "--index", str(index),
                                      "--learn", "memory", "--split", "time", "--min-heldout", "5"], cwd=REPO,
                                     capture_output=True, text=True, timeout=600)
            assert learned.returncode == 0, learned.stderr[-3000:]
            report = json.loads(learned.stdout[learned.stdout.find("{"):])["memory"]
            assert report["installed"] and report["guard"]["interval"][0] > 0
            with srv.client() as c:
                c.post("/admin/index/reload").raise_for_status()
                ready = c.get("/readyz").json()
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not failures
        assert ready["click_memory"]["version"] == "m000001" and ready["click_memory"]["queries"] >= len(queries)
        assert ready["click_memory"]["doc_gate"] is None  # the default: the per-document term for every query

        with srv.client() as c:
            answer = c.post("/search", json={"query": queries[0], "top_k": 10}).json()  # no no-cache: the cache
        assert answer["cached"] is False  # the pre-publication answer is not served
        after = [h["id"] for h in answer["results"]]
        clicked, first = before[queries[0]][CLICKED_RANK - 1], before[queries[0]][0]
        assert after.index(clicked) < CLICKED_RANK - 1
        assert first not in after or after.index(first) > 0  # fell, perhaps out of the top 10
        scores = [h["score"] for h in answer["results"]]
        assert scores == sorted(scores, reverse=True)
        assert all("clicks" in h["scores"] for h in answer["results"])
    finally:
        srv.stop()
