"""A BEIR folder over the bundled demo corpus with hand-written queries, and an index of it."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import DEMO_CORPUS

# query id -> (text, relevant demo documents)
DEMO_QUERIES = {
    "q1": ("How do astronomers find planets around other stars?", ["astro-2"]),
    "q2": ("why does steak turn brown when it is seared", ["cook-2"]),
    "q3": ("irregular heartbeat where the upper chambers quiver", ["cardio-1", "cardio-4"]),
    "q4": ("volcanic eruptions that destroyed towns", ["rome-5", "volcano-4", "volcano-2"]),
    "q5": ("how to repair a punctured bicycle tyre", ["cycle-3"]),
    "q6": ("B-tree structure for fast lookups in a database", ["db-1"]),
    "q7": ("Miles Davis album recorded with John Coltrane", ["jazz-3"]),
    "q8": ("keeping soil acidity right for plants", ["garden-4"]),
}


def write_beir(folder, queries=DEMO_QUERIES):
    (folder / "qrels").mkdir(parents=True)
    shutil.copy(DEMO_CORPUS, folder / "corpus.jsonl")
    with open(folder / "queries.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": qid, "text": text}) + "\n" for qid, (text, _) in queries.items())
    with open(folder / "qrels" / "test.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"{qid}\t{doc}\t1\n" for qid, (_, docs) in queries.items() for doc in docs)
    return folder


@pytest.fixture(scope="session")
def demo_beir(tmp_path_factory):
    return write_beir(tmp_path_factory.mktemp("demo-beir"))


@pytest.fixture(scope="session")
def demo_index(tmp_path_factory, demo_beir, biencoder, cache_dir):
    from sieve.index import build_index, read_beir_corpus

    out = tmp_path_factory.mktemp("demo-index")
    build_index(read_beir_corpus(demo_beir / "corpus.jsonl"), biencoder, out, cache_dir=cache_dir, progress=False)
    return out
