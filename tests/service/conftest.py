from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from index import build_index, read_beir_corpus
from models.weights import default_model_path
from tests.conftest import DEMO_CORPUS
from tests.server import Server


@pytest.fixture(scope="session")
def demo_index(tmp_path_factory, biencoder, cache_dir):
    path = tmp_path_factory.mktemp("demo-index")
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, path, cache_dir=cache_dir, progress=False)
    return path


@pytest.fixture(scope="session")
def ce_checkpoint(tmp_path_factory):
    """A local cross-encoder directory (packaged MiniLM body, seeded untrained head), as a user would point at."""
    path = tmp_path_factory.mktemp("ce-checkpoint")
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=1).save_pretrained(path)
    AutoTokenizer.from_pretrained(str(default_model_path())).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def server(demo_index, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_RERANK_MAX_DOCUMENTS": "50"},
                 tmp_path_factory.mktemp("logs") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def ce_server(demo_index, ce_checkpoint, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_CROSS_ENCODER_PATH": str(ce_checkpoint),
                  "SIEVE_QUERY_OVERFLOW": "reject"},
                 tmp_path_factory.mktemp("logs") / "ce-server.log")
    yield srv
    srv.stop()


@pytest.fixture()
def client(server):
    with server.client() as c:
        yield c
