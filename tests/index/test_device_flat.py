"""Exact search of flat segments on the serving device (index/device_flat.py) answers what FAISS's exact search
answers: same rows, scores within float tolerance, through live writes and deletes. Run here on the CPU device
(fp32); on CUDA the same code runs in fp16."""
from __future__ import annotations

import numpy as np
import pytest

from sieve.index import Document, SearchIndex, apply_changes, build_index
from sieve.index.device_flat import DeviceFlat, flat_backend
from sieve.index.lexical import LexicalConfig

from .conftest import make_docs

PLAIN = LexicalConfig(language="none")


def _compare(path, queries, k):
    with SearchIndex.load(path) as plain, SearchIndex.load(path, flat_device="cpu") as device:
        assert all(s.device_flat is None for s in plain._p.segments)
        assert all(s.device_flat is not None for s in device._p.segments)
        want, got = plain.search(queries, k), device.search(queries, k)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        return got


def test_device_flat_equals_faiss_flat_through_writes_and_deletes(tmp_path, encoder):
    path, docs = tmp_path / "idx", make_docs(200)
    build_index(docs, encoder, path, progress=False, lexical=PLAIN, faiss_kind="flat")
    queries = encoder.encode_queries([d.full_text for d in docs[::9]] + ["w1 w2 w3", "w399"])
    _compare(path, queries, 10)
    # a live write adds a segment; deleting rows tombstones them in the built segment
    added = [Document(f"new{i}", "", f"w{i} w{i + 1} w{i + 2} fresh") for i in range(12)]
    gone = [d.id for d in docs[:40:3]]
    apply_changes(path, added, gone, {"primary": encoder})
    scores, rows = _compare(path, queries, 25)
    with SearchIndex.load(path, flat_device="cpu") as index:
        assert len(index._p.segments) == 2
        hit_ids = {d.id for q in rows for d in index.documents([r for r in q if r >= 0])}
        assert not hit_ids & set(gone)
    # k larger than a whole segment, and than the index
    _compare(path, queries[:3], 150)
    _compare(path, queries[:3], 10_000)


def test_device_flat_search_on_its_own_matches_brute_force():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 16)).astype(np.float32)
    q = rng.standard_normal((300, 16)).astype(np.float32)  # more queries than one matmul chunk
    flat = DeviceFlat(x, "cpu")
    assert flat.backend == "torch" and flat.nbytes() == 1000 * 16 * 4
    scores, rows = flat.search(q, 7)
    want = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_allclose(scores, np.take_along_axis(q @ x.T, want, axis=1), rtol=1e-5, atol=1e-5)


def test_search_scored_keeps_every_rows_score_only_where_the_product_made_them(tmp_path, encoder):
    """search_scored: search()'s very rows and scores, plus each query's score for every row, read from the matrix
    the top k came from (so be[rows] equals the dense list's own scores bit for bit, and the inner products within
    float tolerance); None for one query (FAISS's kernel), an index without device search, or one with deletions."""
    path, docs = tmp_path / "idx", make_docs(120)
    build_index(docs, encoder, path, progress=False, lexical=PLAIN, faiss_kind="flat")
    queries = encoder.encode_queries([d.full_text for d in docs[::13]])  # (10, d)
    with SearchIndex.load(path, flat_device="cpu") as index, SearchIndex.load(path) as plain:
        scores, rows, every = index.search_scored(queries, 15)
        want = index.search(queries, 15)
        np.testing.assert_array_equal(rows, want[1])
        np.testing.assert_array_equal(scores, want[0])
        assert every.shape == (len(queries), index.size) and every.dtype == np.float32
        np.testing.assert_array_equal(np.take_along_axis(every, rows, axis=1), scores)
        np.testing.assert_allclose(every, queries @ index.embeddings(np.arange(index.size)).T, rtol=1e-5, atol=1e-6)
        assert index.search_scored(queries[:1], 15)[2] is None  # one query alone: FAISS's own kernel
        one = index.search_scored(queries[:1], 15)
        np.testing.assert_array_equal(one[1], index.search(queries[:1], 15)[1])
        assert plain.search_scored(queries, 15)[2] is None
        np.testing.assert_array_equal(plain.search_scored(queries, 15)[1], plain.search(queries, 15)[1])
    apply_changes(path, [], [docs[0].id], {"primary": encoder})
    with SearchIndex.load(path, flat_device="cpu") as index:  # rows renumbered by a deletion: no full row
        scores, rows, every = index.search_scored(queries, 15)
        assert every is None
        np.testing.assert_array_equal(rows, index.search(queries, 15)[1])


def test_embeddings_into_writes_the_rows_embeddings_gives(tmp_path, encoder):
    path, docs = tmp_path / "idx", make_docs(80)
    build_index(docs, encoder, path, progress=False, lexical=PLAIN, faiss_kind="flat")
    apply_changes(path, [Document("new", "", "w1 w2 fresh")], [docs[3].id], {"primary": encoder})
    build_index(docs, encoder, tmp_path / "one", progress=False, lexical=PLAIN, faiss_kind="flat")
    for where in (path, tmp_path / "one"):  # two segments with a deletion; one segment
        with SearchIndex.load(where) as index:
            rows = np.array([5, 0, index.size - 1, 5, 17])
            batch = np.full((2, 7, index.embedding_dim()), np.nan, dtype=np.float32)
            index.embeddings_into(rows, batch[1, :5])
            np.testing.assert_array_equal(batch[1, :5], index.embeddings(rows))
            assert np.isnan(batch[0]).all() and np.isnan(batch[1, 5:]).all()  # nothing written outside its block
            with pytest.raises(ValueError, match="out of range"):
                index.embeddings_into(np.array([index.size]), batch[1, :1])
            with pytest.raises(ValueError, match="C-contiguous float32"):
                index.embeddings_into(rows, np.empty((5, index.embedding_dim()), dtype=np.float64))


@pytest.mark.parametrize("device,faiss_gpu", [("cpu", True), ("cpu", False), ("cuda", False)])
def test_backend_is_torch_without_faiss_gpu(device, faiss_gpu):
    assert flat_backend(device, faiss_gpu) == "torch"  # faiss-gpu only on a CUDA device, and only when asked


def test_on_the_cpu_a_float32_map_is_searched_where_it_lies_and_float16_stays_with_faiss(tmp_path, encoder):
    """A CPU server searches flat segments with torch over the memory map itself (no copy: the tensor's memory is
    the map's), and leaves a float16 index to FAISS (torch would need a float32 copy of it in RAM)."""
    docs = make_docs(60)
    build_index(docs, encoder, tmp_path / "f32", progress=False, lexical=PLAIN, faiss_kind="flat")
    build_index(docs, encoder, tmp_path / "f16", progress=False, lexical=PLAIN, faiss_kind="flat", dtype="float16")
    with SearchIndex.load(tmp_path / "f32", flat_device="cpu") as f32, \
            SearchIndex.load(tmp_path / "f16", flat_device="cpu") as f16:
        segment = f32._p.segments[0]
        assert isinstance(segment.embeddings, np.memmap)
        assert segment.device_flat.vectors.data_ptr() == segment.embeddings.ctypes.data  # the same pages
        assert f16._p.segments[0].device_flat is None
        queries = encoder.encode_queries(["w1 w2 w3", docs[7].full_text])
        assert f32.search(queries, 5)[1][:, 0].tolist()[1] == 7
        assert f16.search(queries, 5)[1][:, 0].tolist()[1] == 7


def test_an_intel_or_zen3_and_later_amd_cpu_server_searches_flat_segments_with_torch_unless_told_not_to():
    import torch

    from sieve.service.config import Settings
    from sieve.models.precision import cpu_field
    from sieve.service.runtime import cpu_family, flat_device

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert flat_device(Settings(), cpu, "GenuineIntel") == "cpu" and flat_device(Settings(), cuda) == "cuda"
    # family 25 is Zen 3 (0.93x FAISS's server CPU per /search) and Zen 4 (0.93x, the candidates' scores read from
    # the product's: its product alone costs more than FAISS's AVX-512 kernels)
    assert flat_device(Settings(), cpu, "AuthenticAMD", 25) == "cpu"
    assert flat_device(Settings(), cpu, "AuthenticAMD", 23) is None  # Zen 2 and older: not measured
    assert flat_device(Settings(), cpu, "AuthenticAMD", 26) == "cpu"  # Zen 5: 0.67-0.80x FAISS's
    assert flat_device(Settings(), cpu, "GenuineIntel", 6) == "cpu"
    assert flat_device(Settings(), cpu, "HygonGenuine", 24) is None
    assert flat_device(Settings(), cuda, "AuthenticAMD") == "cuda"
    off = Settings(flat_search_on_device=False)
    assert flat_device(off, cpu, "GenuineIntel") is None and flat_device(off, cuda) is None
    assert isinstance(cpu_field("vendor_id"), str) and cpu_family() >= 0
    assert flat_device(Settings(), cpu) in ("cpu", None)  # this host's own /proc/cpuinfo


@pytest.mark.parametrize("k", [1, 7, 999, 1000])
def test_top_k_is_torch_topk(k):
    """The CPU's top-k (numpy's partition, then a sort of the k) against torch.topk: the same scores best first, the
    same columns where no two scores tie, every k up to the whole row."""
    import torch

    from sieve.index.device_flat import top_k

    scores = np.random.default_rng(1).standard_normal((5, 1000)).astype(np.float32)
    got_s, got_c = top_k(scores, k)
    want = torch.topk(torch.from_numpy(scores), k, dim=1, largest=True, sorted=True)
    np.testing.assert_array_equal(got_s, want.values.numpy())
    np.testing.assert_array_equal(got_c, want.indices.numpy())
    assert got_s.shape == got_c.shape == (5, k)


def test_a_bf16_copy_ranks_as_float32_does_within_bf16s_resolution():
    """DeviceFlat over a bfloat16 copy (CPUs with native bf16 products): every query's scores within bf16's
    resolution of fp32's, nearly the same top k, half the memory; one query is searched there too."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3000, 64)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(3000, 40, replace=False)] + 0.05 * rng.standard_normal((40, 64)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    exact, bf16 = DeviceFlat(x, "cpu"), DeviceFlat(x, "cpu", cpu_dtype="bf16")
    assert (exact.dtype, bf16.dtype) == ("fp32", "bf16") and bf16.takes_single_queries
    assert not exact.takes_single_queries and bf16.nbytes() == 3000 * 64 * 2
    (want_s, want_r), (got_s, got_r) = exact.search(q, 50), bf16.search(q, 50)
    assert got_s.dtype == np.float32 and got_r.dtype == np.int64
    assert np.abs(got_s - want_s).max() < 1e-2  # sorted lists: the k-th best score of each, whichever row holds it
    np.testing.assert_array_equal(got_r[:, 0], want_r[:, 0])  # each query's own document first (the others: far)
    overlap = np.mean([len(set(a) & set(b)) / 50 for a, b in zip(got_r, want_r)])
    assert overlap > 0.9, overlap
    full = q @ x.T
    np.testing.assert_allclose(np.take_along_axis(full, got_r, axis=1), got_s, atol=1e-2)
    one = bf16.search(q[3:4], 50)  # one query alone: its batch's answer (near ties aside: the product's kernel
    assert one[1][0, 0] == got_r[3, 0]  # for one row may round a score differently)
    assert len(set(one[1][0, :10]) & set(got_r[3, :10])) >= 8
    np.testing.assert_allclose(one[0][0], got_s[3], atol=1e-2)


def test_an_index_with_a_bf16_copy_searches_every_batch_size_there(tmp_path, encoder):
    """flat_cpu_dtype='bf16': the copy is made for float32 and float16 maps alike, one query goes through it (its
    every-row scores kept, as for a batch), and the ranking a query gets does not depend on its batch."""
    docs = make_docs(120)
    build_index(docs, encoder, tmp_path / "f32", progress=False, lexical=PLAIN, faiss_kind="flat")
    build_index(docs, encoder, tmp_path / "f16", progress=False, lexical=PLAIN, faiss_kind="flat", dtype="float16")
    queries = encoder.encode_queries([d.full_text for d in docs[::13]])  # (10, d)
    for path in (tmp_path / "f32", tmp_path / "f16"):
        with SearchIndex.load(path, flat_device="cpu", flat_cpu_dtype="bf16") as index, SearchIndex.load(path) as plain:
            assert index._p.segments[0].device_flat.dtype == "bf16"
            scores, rows, every = index.search_scored(queries, 15)
            assert every.shape == (len(queries), index.size)
            np.testing.assert_array_equal(np.take_along_axis(every, rows, axis=1), scores)
            one = index.search_scored(queries[4:5], 15)  # kept for one query too
            assert one[2] is not None and one[1][0, 0] == rows[4, 0]
            np.testing.assert_allclose(one[0][0], scores[4], atol=1e-2)
            np.testing.assert_array_equal(index.search(queries[4:5], 15)[1], one[1])
            want = plain.search(queries, 15)
            np.testing.assert_array_equal(rows[:, 0], want[1][:, 0])  # each document's own text finds it first
            np.testing.assert_allclose(scores, want[0], atol=1e-2)


def test_the_flat_search_runs_bf16_only_where_the_cpu_multiplies_bf16_and_nothing_asks_for_fp32():
    from sieve.service.config import Settings
    from sieve.service.runtime import flat_search_precision

    auto = Settings(precision="auto", flat_search_precision="auto")  # the suite's environment sets fp32
    assert flat_search_precision(auto, "cpu", bf16=True).dtype == "bf16"
    assert flat_search_precision(auto, "cpu", bf16=False).dtype == "fp32"
    assert flat_search_precision(Settings(precision="fp32"), "cpu", bf16=True).as_dict()["reason"] == \
        "SIEVE_PRECISION=fp32"
    assert flat_search_precision(Settings(precision="auto", flat_search_precision="fp32"), "cpu",
                                 bf16=True).reason == "SIEVE_FLAT_SEARCH_PRECISION=fp32"
    assert flat_search_precision(auto, None, bf16=True).dtype == "fp32"  # FAISS's exact search
    assert flat_search_precision(auto, "cuda", bf16=True).dtype == "fp16"


def test_a_flat_segment_too_large_for_a_bf16_copy_keeps_its_float32_map(tmp_path, encoder, monkeypatch):
    from sieve.index import segments

    docs = make_docs(60)
    build_index(docs, encoder, tmp_path / "idx", progress=False, lexical=PLAIN, faiss_kind="flat")
    monkeypatch.setattr(segments, "BF16_COPY_MAX_BYTES", 60 * encoder.dim * 2 - 1)  # one byte short
    with SearchIndex.load(tmp_path / "idx", flat_device="cpu", flat_cpu_dtype="bf16") as index:
        flat = index._p.segments[0].device_flat
        assert flat.dtype == "fp32" and flat.vectors.data_ptr() == index._p.segments[0].embeddings.ctypes.data
    monkeypatch.setattr(segments, "BF16_COPY_MAX_BYTES", 60 * encoder.dim * 2)
    with SearchIndex.load(tmp_path / "idx", flat_device="cpu", flat_cpu_dtype="bf16") as index:
        assert index._p.segments[0].device_flat.dtype == "bf16"


def test_a_bf16_copy_follows_live_writes_and_deletes(tmp_path, encoder):
    """Each segment a write adds gets its own copy; deleted rows never come back; every query still finds its own
    document first."""
    path, docs = tmp_path / "idx", make_docs(150)
    build_index(docs, encoder, path, progress=False, lexical=PLAIN, faiss_kind="flat")
    added = [Document(f"new{i}", "", f"w{i} w{i + 1} w{i + 2} fresh") for i in range(12)]
    gone = [d.id for d in docs[:40:3]]
    apply_changes(path, added, gone, {"primary": encoder})
    kept = [d for d in docs if d.id not in gone][::7] + added[::4]
    queries = encoder.encode_queries([d.full_text for d in kept])
    with SearchIndex.load(path, flat_device="cpu", flat_cpu_dtype="bf16") as index, SearchIndex.load(path) as plain:
        assert [s.device_flat.dtype for s in index._p.segments] == ["bf16", "bf16"]
        scores, rows = index.search(queries, 20)
        hits = [[d.id for d in index.documents([r for r in q if r >= 0])] for q in rows]
        assert [h[0] for h in hits] == [d.id for d in kept]
        assert not {i for h in hits for i in h} & set(gone)
        np.testing.assert_allclose(scores, plain.search(queries, 20)[0], atol=1e-2)
