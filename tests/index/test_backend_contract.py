"""The index contract (sieve/index/protocol.py): the local segmented index and a Qdrant collection on two engines
(the client's own local mode, a pure-Python Qdrant in process; qdrant-edge-py, Qdrant's Rust shard engine in
process) run through the same cases, with the packaged bi-encoder and Sieve's BM25 analyzer, and the pipeline (be,
bm25, hybrid, then CMC with first-stage evidence) answers the same on all three."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.index import SearchIndex, UnknownDocumentError, build_index, read_beir_corpus
from sieve.index.protocol import IndexBackend
from sieve.index.qdrant_backend import QdrantConfig
from sieve.index.qdrant_build import build_qdrant
from tests.conftest import DEMO_CORPUS

QUERIES = ["how do volcanoes erupt", "baking bread with yeast", "roman empire legions", "the the and"]
BACKENDS = ["local", "qdrant", "qdrant-edge"]


@pytest.fixture(scope="module")
def docs():
    return read_beir_corpus(DEMO_CORPUS)


@pytest.fixture(scope="module")
def local(tmp_path_factory, biencoder, cache_dir, docs):
    path = tmp_path_factory.mktemp("contract-local")
    build_index(docs, biencoder, path, cache_dir=cache_dir, progress=False)
    with SearchIndex.load(path) as index:
        yield index


@pytest.fixture(scope="module")
def qdrant(biencoder, cache_dir, docs):
    index = build_qdrant(docs, {"primary": biencoder}, QdrantConfig(":memory:", "contract"), cache_dir=cache_dir,
                         progress=False)
    yield index
    index.close()


@pytest.fixture(scope="module")
def edge(tmp_path_factory, biencoder, cache_dir, docs):
    config = QdrantConfig(str(tmp_path_factory.mktemp("contract-edge")), "contract", engine="edge")
    index = build_qdrant(docs, {"primary": biencoder}, config, cache_dir=cache_dir, progress=False)
    yield index
    index.close()


@pytest.fixture(params=BACKENDS)
def backend(request, local, qdrant, edge):
    return {"local": local, "qdrant": qdrant, "qdrant-edge": edge}[request.param]


def query_vector(biencoder, text: str) -> np.ndarray:
    return biencoder.encode_queries([text])[0].float().cpu().numpy()


def test_each_implements_the_protocol(backend, docs):
    assert isinstance(backend, IndexBackend)
    assert backend.size == len(docs) and backend.has_lexical


@pytest.mark.parametrize("query", QUERIES[:3])
def test_dense_hits_are_the_exact_inner_product_top_k(backend, local, biencoder, docs, query):
    vector = query_vector(biencoder, query)
    everything = local.embeddings(np.arange(local.size)) @ vector  # (N,)
    exact = [local.ids([r])[0] for r in np.argsort(-everything, kind="stable")[:10]]
    hits = backend.dense_hits(vector, 10)
    ids = hits.ids if hits.ids is not None else backend.ids(hits.rows)
    assert ids == exact
    np.testing.assert_allclose(hits.scores, np.sort(everything)[::-1][:10], rtol=1e-5, atol=1e-5)
    if backend.returns_vectors:  # the vectors come with the hits, equal to the stored ones
        np.testing.assert_allclose(hits.vectors, local.embeddings(local.rows_for_ids(ids)), atol=1e-6)


@pytest.mark.parametrize("query", QUERIES)
def test_bm25_scores_are_the_local_index_scores(backend, local, query):
    expected_scores, expected_rows = local.search_lexical(query, 20)
    hits = backend.lexical_hits(query, 20)
    ids = hits.ids if hits.ids is not None else backend.ids(hits.rows)
    # the same documents with the same scores ("the the and": only stop words, nothing on either); equal scores may
    # come in another order (the local index breaks ties by row, Qdrant by its own order)
    assert sorted(ids) == sorted(local.ids(expected_rows))
    expected = dict(zip(local.ids(expected_rows), expected_scores.tolist()))
    np.testing.assert_allclose([expected[i] for i in ids], hits.scores, rtol=1e-5, atol=1e-5)
    assert (np.diff(hits.scores) <= 0).all()


def test_bm25_of_given_documents(backend, local):
    some = ["astro-1", "cook-2", "rome-3", "rome-5", "cardio-4", "ml-1"]
    expected = local.lexical_scores_of("roman legions and bread", local.rows_for_ids(some))
    got = backend.lexical_scores_of("roman legions and bread", backend.rows_for_ids(some))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_both_lists_in_one_call(backend, local, biencoder):
    vector = query_vector(biencoder, "bread")
    dense, lexical = backend.both_hits(vector, "bread", 5)
    assert len(dense) == 5 and 0 < len(lexical) <= 5
    assert (dense.ids or backend.ids(dense.rows)) == local.ids(local.dense_hits(vector, 5).rows)


def test_documents_ids_and_vectors_by_id(backend, local, docs):
    wanted = [docs[7].id, docs[3].id, docs[7].id]
    rows = backend.rows_for_ids(wanted)
    assert backend.ids(rows) == wanted
    assert backend.documents(rows) == [docs[7], docs[3], docs[7]]
    np.testing.assert_allclose(backend.embeddings(rows), local.embeddings(local.rows_for_ids(wanted)), atol=1e-6)
    assert backend.has_id(docs[0].id) and not backend.has_id("no-such-doc")
    with pytest.raises(UnknownDocumentError):
        backend.rows_for_ids([docs[0].id, "no-such-doc"])
    assert not backend.has_store("cmc")


def test_identities_name_the_backend_and_collection(local, qdrant, edge):
    assert len({local.identity(), qdrant.identity(), edge.identity()}) == 3
    assert qdrant.identity().startswith("qdrant::memory::contract:")
    assert edge.identity().startswith(f"qdrant-edge:{edge.config.location}:contract:")
    assert qdrant.identity() == qdrant.identity() and edge.identity() == edge.identity()  # stable without writes


# -- the pipeline on each: the stages never reach past the contract ----------------------------------------------
PIPELINE_QUERIES = ["how do volcanoes erupt", "baking bread with yeast", "training a neural network", "jazz improvisation"]


@pytest.fixture(scope="module")
def searchers(local, qdrant, edge, biencoder):
    from sieve import checkpoints
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.pipeline.searcher import Searcher

    cmc = load_cmc(checkpoints.shipped(checkpoints.CMC), biencoder)  # the shipped default: fuses first-stage evidence
    assert cmc.config.evidence
    made = {name: Searcher(biencoder, index, cmc=cmc)
            for name, index in (("local", local), ("qdrant", qdrant), ("qdrant-edge", edge))}
    yield made
    for searcher in made.values():
        searcher.close()


def ranked(outcome) -> list[tuple[str, dict]]:
    cands = outcome.candidates
    ids = cands.ids if cands.ids is not None else outcome.index.ids(cands.rows)
    return [(doc_id, {k: float(v[i]) for k, v in cands.scores.items()}) for i, doc_id in enumerate(ids)]


@pytest.mark.parametrize("retriever", ["be", "bm25", "hybrid"])
@pytest.mark.parametrize("rerank", ["none", "cmc"])
@pytest.mark.parametrize("query", PIPELINE_QUERIES)
@pytest.mark.parametrize("engine", ["qdrant", "qdrant-edge"])
def test_the_pipeline_answers_as_on_the_local_index(searchers, engine, retriever, rerank, query):
    from sieve.pipeline.searcher import SearchParams

    params = SearchParams(query, top_k=10, retrieve_k=40, rerank=rerank, retriever=retriever)
    local, qdrant = (ranked(searchers[name].search(params)) for name in ("local", engine))
    assert [doc_id for doc_id, _ in qdrant] == [doc_id for doc_id, _ in local]
    for (_, want), (_, got) in zip(local, qdrant):
        assert want.keys() == got.keys()
        np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=1e-4, atol=1e-4)
