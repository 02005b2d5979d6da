"""The evidence features (pipeline/evidence.py) are the numbers numpy's own formulas give, bit for bit: a served CMC
must see the features it was trained on, whatever shortcut serving takes."""
from __future__ import annotations

import numpy as np

from sieve.pipeline.evidence import FEATURES, features, position_prior, standardised


def reference(be, bm25):
    """The features as first written: numpy's mean, std, nan_to_num and stable argsort, column by column."""
    be, bm25 = np.asarray(be, dtype=np.float64), np.nan_to_num(np.asarray(bm25, dtype=np.float64))

    def rank(v):
        out = np.empty(len(v))
        out[np.argsort(-v, kind="stable")] = -np.log1p(np.arange(len(v), dtype=np.float64))
        return out

    def z(v):
        return (v - v.mean()) / v.std() if v.std() > 0 else np.zeros_like(v)

    top = bm25.max(initial=0.0)
    cols = [-np.log1p(np.arange(len(be), dtype=np.float64)), rank(be), rank(bm25), be,
            bm25 / top if top > 0 else np.zeros_like(bm25), bm25 > 0, z(be), z(bm25)]
    return np.stack([np.asarray(c, dtype=np.float64) for c in cols], axis=1).astype(np.float32)


def test_features_are_numpys_formulas_bit_for_bit():
    rng = np.random.default_rng(5)
    for k in [1, 2, 7, 100, 512, 1000]:
        for trial in range(5):
            be = rng.standard_normal(k).astype(np.float32) * rng.uniform(0.01, 10)
            bm25 = np.abs(rng.standard_normal(k)).astype(np.float32) * (rng.random(k) < 0.6)
            if trial == 1:
                bm25[rng.random(k) < 0.2] = np.nan  # texts outside the index: no BM25
            if trial == 2:
                bm25[:] = 0.0  # no candidate shares a term: std 0
            if trial == 3:
                be[:] = 0.25  # constant: std 0
            got, want = features(be, bm25), reference(be, bm25)
            assert got.shape == (k, len(FEATURES)) and np.array_equal(got, want, equal_nan=True), (k, trial)
            assert np.array_equal(features(be, bm25, 3), want[:, :3])


def test_features_with_ties_signed_zeros_and_extremes_are_numpys_formulas_bit_for_bit():
    """The float32 shortcut's rank keys and row-wise sums against the reference: ties (ranks in order of
    appearance), -0.0 beside 0.0, subnormal and huge scores, negative BM25 only, infinities (the column path),
    float64 scores (the column path), a list of one, and every n."""
    rng = np.random.default_rng(9)
    for trial in range(300):
        k = int(rng.choice([1, 2, 3, 64, 512]))
        be = (rng.standard_normal(k) * 3).astype(np.float32)
        bm25 = (np.abs(rng.standard_normal(k)) * 5).astype(np.float32) * (rng.random(k) < 0.5)
        kind = trial % 8
        if kind == 1:
            be, bm25 = np.round(be), np.round(bm25)  # many ties
        if kind == 2:
            be[rng.random(k) < 0.4], bm25[rng.random(k) < 0.4] = -0.0, -0.0  # -0.0 ties with 0.0
        if kind == 3:
            be, bm25 = be * np.float32(1e-39), bm25 * np.float32(1e-41)  # subnormal
        if kind == 4:
            be, bm25 = be * np.float32(1e37), np.full(k, 3e38, dtype=np.float32)
        if kind == 5:
            bm25 = -bm25  # no positive BM25
        if kind == 6:
            be[rng.integers(k)] = rng.choice([np.inf, -np.inf])
        if kind == 7:
            be = be.astype(np.float64) / 3
        with np.errstate(invalid="ignore"):  # an infinite be: inf - inf in its standardisation
            want = reference(be, bm25)
            got_all = [features(be, bm25, n) for n in range(1, len(FEATURES) + 1)]
        for n, got in enumerate(got_all, 1):
            assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == (k, n)
            assert np.array_equal(got.view(np.uint32), want[:, :n].view(np.uint32)), (trial, n)


def test_standardised_of_nothing_and_of_a_constant():
    assert standardised(np.empty(0)).shape == (0,)
    assert not standardised(np.full(4, 3.0)).any()
    # log1p(2) and log(3) may differ in the last bit, by host (numpy's SIMD log on an AVX2-only Zen 3 host did)
    np.testing.assert_allclose(position_prior(3), [0.0, -np.log(2), -np.log(3)], rtol=1e-14, atol=0)
