"""`sieve feedback import`: an exported click log (query, shown ids in order, clicked ids) becomes impressions with
the candidates and evidence the learner needs, and click events; a clicked id that was not shown is dropped."""
from __future__ import annotations

import json
import subprocess
import sys

from sieve.feedback.log import read_records
from sieve.index import build_index, read_beir_corpus
from tests.conftest import DEMO_CORPUS
from tests.server import REPO


def test_import_appends_impressions_and_clicks(biencoder, cache_dir, tmp_path):
    index = tmp_path / "index"
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, index, cache_dir=cache_dir, progress=False)
    log = tmp_path / "export.jsonl"
    log.write_text("\n".join(json.dumps(row) for row in [
        {"query": "red giant stars", "shown": ["astro-2", "astro-1"], "clicked": ["astro-1"]},
        {"query": "exoplanet transits", "shown": ["astro-2"], "clicked": ["astro-2", "not-shown"]},
    ]) + "\n")
    done = subprocess.run([sys.executable, "-m", "sieve.cli", "feedback", "import", str(log), "--index", str(index)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    impressions = list(read_records(index / "feedback", "impressions"))
    events = list(read_records(index / "feedback", "events"))
    assert [i["shown"] for i in impressions] == [["astro-2", "astro-1"], ["astro-2"]]
    assert all(len(i["candidates"]) > 10 and "vector" in i and "query" not in i for i in impressions)
    assert [(e["request_id"], e["doc_id"]) for e in events] == [(impressions[0]["request_id"], "astro-1"),
                                                                 (impressions[1]["request_id"], "astro-2")]
