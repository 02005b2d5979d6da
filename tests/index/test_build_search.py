from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sieve.index import Document, SearchIndex, build_faiss, build_index, to_device
from sieve.index.cache import cache_file, cache_key
from sieve.index.vectors import gpu_count

from .conftest import FakeEncoder, make_docs


def _reference(emb: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = q @ emb.T
    rows = np.argsort(-scores, axis=1)[:, :k]
    return np.take_along_axis(scores, rows, axis=1), rows


def test_flat_search_is_exact(built: Path, docs, encoder) -> None:
    emb = encoder.encode_documents([d.full_text for d in docs])
    queries = np.random.default_rng(1).standard_normal((20, encoder.dim)).astype(np.float32)
    with SearchIndex.load(built) as index:
        # the default "auto" searches a segment this small exactly
        assert (index.size, index.version, index.manifest.faiss_kind) == (300, 1, "auto")
        assert [s["ann"] for s in index.manifest.segments] == ["flat"]
        scores, rows = index.search(queries, 10)
        ref_scores, ref_rows = _reference(emb, queries, 10)
        assert scores.dtype == np.float32 and rows.dtype == np.int64
        np.testing.assert_array_equal(rows, ref_rows)
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
        assert index.ids(rows[0][:3]) == [docs[r].id for r in ref_rows[0][:3]]
        assert index.documents(rows[0][:3]) == [docs[r] for r in ref_rows[0][:3]]


def test_k_larger_than_size_and_empty_batch(tmp_path: Path, encoder) -> None:
    build_index(make_docs(5), encoder, tmp_path / "i", progress=False)
    with SearchIndex.load(tmp_path / "i") as index:
        scores, rows = index.search(np.ones((2, encoder.dim), np.float32), 50)
        assert scores.shape == rows.shape == (2, 5)
        assert sorted(rows[0].tolist()) == list(range(5))
        assert index.search(np.ones((0, encoder.dim), np.float32), 3)[1].shape == (0, 3)


@pytest.mark.parametrize("kind, params, search_kw", [
    ("ivf", {"nlist": 8}, {"nprobe": 4}),
    ("ivf", None, {}),
    ("hnsw", {"M": 16, "ef_construction": 64}, {"ef_search": 64}),
])
def test_ann_kinds_recall_own_vector(tmp_path: Path, encoder, kind, params, search_kw) -> None:
    docs = make_docs(400)
    m = build_index(docs, encoder, tmp_path / kind, faiss_kind=kind, faiss_params=params,
                    progress=False)
    if kind == "ivf":
        assert m.faiss_params["nlist"] == (params or {}).get("nlist", 400 // 39)
    with SearchIndex.load(tmp_path / kind, **search_kw) as index:
        emb = index.embeddings(range(index.size))
        _, rows = index.search(emb, 5)
    recall = np.mean(rows[:, 0] == np.arange(len(docs)))
    assert recall >= 0.95


def test_ann_short_results_are_filled_exactly(tmp_path: Path, encoder, docs) -> None:
    # One probed list out of 32 cannot hold k=200 hits: FAISS pads with -1.
    build_index(docs, encoder, tmp_path / "i", faiss_kind="ivf", faiss_params={"nlist": 32},
                progress=False)
    queries = np.random.default_rng(2).standard_normal((4, encoder.dim)).astype(np.float32)
    with SearchIndex.load(tmp_path / "i", nprobe=1) as index:
        scores, rows = index.search(queries, 200)
        ref_scores, ref_rows = _reference(index.embeddings(range(index.size)), queries, 200)
    assert (rows >= 0).all()
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_float16_round_trip(tmp_path: Path, docs, encoder) -> None:
    build_index(docs, encoder, tmp_path / "h", dtype="float16", progress=False)
    assert np.load(tmp_path / "h" / "versions" / "v000001" / "embeddings.npy",
                   mmap_mode="r").dtype == np.float16
    expected = encoder.encode_documents([d.full_text for d in docs])
    with SearchIndex.load(tmp_path / "h") as index:
        got = index.embeddings([0, 5, 299, 5])
        _, rows = index.search(expected[:10], 1)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected[[0, 5, 299, 5]], atol=1e-3)
    assert rows[:, 0].tolist() == list(range(10))


@pytest.mark.parametrize("kwargs, fragment", [
    ({"faiss_kind": "lsh"}, "unknown faiss kind 'lsh'; allowed: auto, flat, ivf, hnsw"),
    ({"faiss_kind": "ivf", "faiss_params": {"M": 4}}, "allowed: ann_min_rows, nlist"),
    ({"faiss_kind": "hnsw", "faiss_params": {"M": 0}}, "positive integer"),
    ({"dtype": "int8"}, "allowed: float32, float16"),
    ({"extra_stores": {"primary": FakeEncoder()}}, "invalid store name"),
])
def test_bad_build_options_fail_before_encoding(tmp_path: Path, docs, encoder, kwargs,
                                                fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        build_index(docs, encoder, tmp_path / "i", progress=False, **kwargs)
    assert encoder.calls == 0 and not (tmp_path / "i" / "CURRENT").exists()


def test_empty_and_duplicate_corpus_refused(tmp_path: Path, encoder) -> None:
    with pytest.raises(ValueError, match="corpus is empty"):
        build_index([], encoder, tmp_path / "i")
    dup = [Document("a", "", "x"), Document("b", "", "y"), Document("a", "", "z")]
    with pytest.raises(ValueError, match="duplicate document id.*'a'"):
        build_index(dup, encoder, tmp_path / "i")


def test_cache_hit_skips_encoding(tmp_path: Path, docs) -> None:
    cache = tmp_path / "cache"
    first = FakeEncoder()
    build_index(docs, first, tmp_path / "a", cache_dir=cache, progress=False)
    assert first.calls == 1
    assert cache_file(cache, cache_key(first, [d.full_text for d in docs])).exists()
    second = FakeEncoder()
    build_index(docs, second, tmp_path / "b", cache_dir=cache, progress=False)
    assert second.calls == 0
    other_length = FakeEncoder(max_length=64)
    build_index(docs, other_length, tmp_path / "c", cache_dir=cache, progress=False)
    assert other_length.calls == 1  # max_length is part of the key
    with SearchIndex.load(tmp_path / "a") as a, SearchIndex.load(tmp_path / "b") as b:
        np.testing.assert_array_equal(a.embeddings(range(300)), b.embeddings(range(300)))


def test_bad_encoder_output_refused(tmp_path: Path, docs) -> None:
    class Wrong(FakeEncoder):
        def encode_documents(self, texts, progress=True):
            return super().encode_documents(texts)[:, :8]
    with pytest.raises(ValueError, match=r"returned shape \(300, 8\).*expected \(300, 32\)"):
        build_index(docs, Wrong(), tmp_path / "i", progress=False)


def test_search_argument_errors(built: Path, encoder) -> None:
    with SearchIndex.load(built) as index:
        with pytest.raises(ValueError, match=r"shape \(B, 32\)"):
            index.search(np.ones(32, np.float32), 3)
        with pytest.raises(ValueError, match="positive integer"):
            index.search(np.ones((1, 32), np.float32), 0)
        with pytest.raises(ValueError, match=r"out of range; allowed rows are 0..299"):
            index.documents([1, 300])
        with pytest.raises(ValueError, match="unknown embedding store 'cmc'"):
            index.embeddings([0], store="cmc")
    with pytest.raises(RuntimeError, match="closed"):
        index.ids([0])


def test_rows_for_ids(built: Path, docs) -> None:
    from sieve.index import UnknownDocumentError
    with SearchIndex.load(built) as index:
        assert index.rows_for_ids(["d7", "d0"]) == [7, 0]
        with pytest.raises(UnknownDocumentError, match="unknown document id.*'nope'") as exc:
            index.rows_for_ids(["d1", "nope"])
        assert exc.value.ids == ["nope"] and isinstance(exc.value, KeyError)


def test_to_device_cpu_cases(encoder) -> None:
    emb = encoder.encode_documents(["a b", "c d"])
    flat, hnsw = build_faiss(emb, "flat", None), build_faiss(emb, "hnsw", None)
    assert to_device(flat, use_gpu=False) is flat
    assert to_device(hnsw, use_gpu=True) is hnsw  # FAISS has no GPU HNSW
    if gpu_count() == 0:
        assert to_device(flat, use_gpu=True) is flat  # faiss-cpu: must not fail
