"""`sieve index build/add/delete --backend qdrant|qdrant-edge` as an operator runs them (subprocesses), on the
client's local mode and on qdrant-edge: the collection holds the corpus, an add and a delete are acknowledged and
visible."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sieve.index.qdrant_backend import QdrantConfig, QdrantIndex
from tests.conftest import DEMO_CORPUS, REPO


def sieve(*args: str, cache_dir) -> dict:
    env = {**os.environ, "SIEVE_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-m", "sieve.cli", "index", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["qdrant", "qdrant-edge"])
def test_build_add_delete_on_qdrant(tmp_path, cache_dir, backend):
    flag = "--qdrant-url" if backend == "qdrant" else "--qdrant-edge-path"
    where = ["--backend", backend, flag, str(tmp_path / "q"), "--collection", "cli"]
    built = sieve("build", *where, "--corpus", str(DEMO_CORPUS), cache_dir=cache_dir)
    assert built["count"] == 60 and built["lexical"]["language"] == "english"
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"_id": "tea-1", "title": "Tea", "text": "Green tea leaves are steamed."}) + "\n")
    assert sieve("add", *where, "--corpus", str(extra), cache_dir=cache_dir)["count"] == 61
    assert sieve("delete", *where, "astro-1", cache_dir=cache_dir)["count"] == 60
    index = QdrantIndex(QdrantConfig(str(tmp_path / "q"), "cli", engine="client" if backend == "qdrant" else "edge"))
    assert index.has_id("tea-1") and not index.has_id("astro-1")
    assert index.lexical_hits("steamed tea", 1).ids == ["tea-1"]
    index.close()
