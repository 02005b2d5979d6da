"""A /search's exact search of a flat segment (a few queries: index/vectors.py `small_batch_top_k`, one matrix product
and a partial sort) answers what FAISS's brute force answers for a batch: same rows, scores within float tolerance,
ties by row, k above the segment's size, deleted rows dropped."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from sieve.index import Document, SearchIndex, apply_changes, build_index
from sieve.index.lexical import LexicalConfig
from sieve.index.vectors import SMALL_BATCH, small_batch_top_k

from .conftest import make_docs


@pytest.mark.parametrize("n,k,b", [(1000, 1, 1), (1000, 10, 3), (1000, 512, 1), (300, 512, 2), (64, 64, SMALL_BATCH)])
def test_small_batch_top_k_matches_faiss_brute_force(n, k, b):
    rng = np.random.default_rng(n + k + b)
    x = rng.standard_normal((n, 32)).astype(np.float32)
    q = rng.standard_normal((b, 32)).astype(np.float32)
    want_s, want_r = faiss.knn(q, x, min(k, n), metric=faiss.METRIC_INNER_PRODUCT)
    got_s, got_r = small_batch_top_k(q, x, k)
    assert got_s.dtype == np.float32 and got_r.dtype == np.int64 and got_r.shape == (b, min(k, n))
    np.testing.assert_array_equal(got_r, want_r)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-5)


def test_ties_keep_row_order():
    x = np.ones((6, 4), np.float32)
    x[4] = 2.0
    scores, rows = small_batch_top_k(np.ones((1, 4), np.float32), x, 4)
    assert rows.tolist() == [[4, 0, 1, 2]] and scores.tolist() == [[8.0, 4.0, 4.0, 4.0]]


def test_one_query_answers_as_a_batch_through_writes_and_deletes(tmp_path, encoder):
    path, docs = tmp_path / "idx", make_docs(150)
    build_index(docs, encoder, path, progress=False, lexical=LexicalConfig(language="none"), faiss_kind="flat")
    apply_changes(path, [Document(f"new{i}", "", f"w{i} w{i + 1} fresh") for i in range(9)],
                  [d.id for d in docs[:30:4]], {"primary": encoder})
    queries = encoder.encode_queries([d.full_text for d in docs[1::7]] + ["w3 fresh"])
    assert len(queries) > SMALL_BATCH  # the batch goes through FAISS, each query alone through small_batch_top_k
    with SearchIndex.load(path) as index:
        for k in (5, 40, 10_000):
            batch_s, batch_r = index.search(queries, k)
            for i in range(len(queries)):
                one_s, one_r = index.search(queries[i:i + 1], k)
                np.testing.assert_array_equal(one_r[0], batch_r[i])
                np.testing.assert_allclose(one_s[0], batch_s[i], rtol=1e-5, atol=1e-6)
