from __future__ import annotations

import pytest

from sieve.index import SearchIndex, build_index, read_beir_corpus
from tests.conftest import DEMO_CORPUS


@pytest.fixture(scope="session")
def demo_index_dir(tmp_path_factory, biencoder, cache_dir):
    path = tmp_path_factory.mktemp("pipeline-demo-index")
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, path, cache_dir=cache_dir, progress=False)
    return path


@pytest.fixture()
def demo(demo_index_dir):
    with SearchIndex.load(demo_index_dir) as index:
        yield index
