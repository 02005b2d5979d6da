"""End to end on a real server: clicks through POST /feedback, `sieve feedback learn` on the logs it wrote, and the
learned CMC swapped in live (published into the index's adapted store, POST /admin/index/reload) while searches
keep arriving: not one of them fails, and /readyz then serves the adapted CMC."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

from sieve.feedback.log import read_records
from sieve.index import read_beir_corpus
from tests.conftest import DEMO_CORPUS
from tests.server import REPO, Server


def test_learned_model_swaps_live_under_load(demo_index, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(demo_index, index)
    docs = read_beir_corpus(DEMO_CORPUS)
    srv = Server({"SIEVE_INDEX_DIR": str(index), "SIEVE_FEEDBACK_ENABLED": "true", "SIEVE_CMC_PATH": ""},
                 tmp_path / "server.log", shipped_models=True)
    try:
        with srv.client() as c:
            for doc in docs * 2:  # each title as a query; the user clicks the document it titles when shown
                answer = c.post("/search", json={"query": doc.title, "top_k": 10}).json()
                if doc.id in [h["id"] for h in answer["results"]]:
                    r = c.post("/feedback", json={"events": [{"request_id": answer["request_id"], "doc_id": doc.id}]})
                    assert r.status_code == 200, r.text
        assert len(list(read_records(index / "feedback", "events"))) >= 60
        out = tmp_path / "learned"
        learned = subprocess.run([sys.executable, "-m", "sieve.cli", "feedback", "learn", "--index", str(index),
                                  "--steps", "20", "--layers", "0", "--min-heldout", "5", "--dry-run", "--out",
                                  str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert learned.returncode in (0, 3), learned.stderr[-3000:]  # 3: the guard's call (the demo is too easy)
        report = json.loads(learned.stdout[learned.stdout.find("{"):])
        assert report["installed"] is None and report["split"]["train"] >= 20 and report["guard"]["heldout_answers"]
        assert report["propensity"]["source"].startswith("default")  # no swaps were configured
        assert (out / "config.json").is_file() and (out / "feedback.json").is_file()

        failures, stop = [], threading.Event()

        def load():
            with srv.client() as client:
                while not stop.is_set():
                    r = client.post("/search", json={"query": "how do stars die", "top_k": 5},
                                    headers={"Cache-Control": "no-cache"})
                    if r.status_code != 200:
                        failures.append(r.status_code)

        threads = [threading.Thread(target=load) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            from sieve.index.adapted import LocalAdapted

            store = LocalAdapted(index)
            tmp = store.new_work_dir()
            shutil.copytree(out, tmp, dirs_exist_ok=True)
            store.publish(tmp)  # what `sieve feedback learn` does once its guard passes
            with srv.client() as c:
                reloaded = c.post("/admin/index/reload").json()
                ready = c.get("/readyz").json()
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert reloaded["cmc_changed"] is True
        assert ready["cmc"]["source"] == "adapted"
        assert not failures
    finally:
        srv.stop()
