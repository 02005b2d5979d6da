"""The BM25 part of an index version: scores, analyzer, and that it moves with the dense part on every write."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sieve.index import Document, SearchIndex, add_documents, apply_changes, build_index, delete_documents
from sieve.index.lexical import LexicalConfig, top_positive
from sieve.index.layout import read_current

from .conftest import make_docs

REPO = Path(__file__).resolve().parents[2]
TOY = [Document("d0", "", "apple banana apple"), Document("d1", "", "banana cherry"),
       Document("d2", "", "cherry cherry cherry date"), Document("d3", "", "elderberry")]
PLAIN = LexicalConfig(language="none")  # no stemming, no stop words: the terms are the words


def hand_bm25(docs: list[list[str]], query: list[str], k1=1.5, b=0.75) -> list[float]:
    """Lucene's BM25 (bm25s's default): idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf / (tf + k1 (1 - b + b dl/avgdl))."""
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    out = []
    for doc in docs:
        score = 0.0
        for term in query:
            df = sum(term in d for d in docs)
            tf = doc.count(term)
            if tf:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                score += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        out.append(score)
    return out


@pytest.fixture()
def toy(tmp_path, encoder):
    build_index(TOY, encoder, tmp_path / "toy", progress=False, lexical=PLAIN)
    with SearchIndex.load(tmp_path / "toy") as index:
        yield index


def test_scores_match_hand_computed_bm25(toy):
    words = [d.text.split() for d in TOY]
    for query in ("banana", "cherry apple", "date elderberry banana"):
        expected = hand_bm25(words, query.split())
        assert toy.lexical_scores(query) == pytest.approx(expected, rel=1e-5)
        scores, rows = toy.search_lexical(query, 10)
        positive = [r for r in np.argsort([-e for e in expected], kind="stable") if expected[r] > 0]
        assert rows.tolist() == positive and scores == pytest.approx([expected[r] for r in positive], rel=1e-5)


def test_unknown_terms_score_nothing(toy):
    assert toy.search_lexical("zucchini", 5)[1].tolist() == []
    assert not toy.lexical_scores("zucchini").any()


def test_english_analyzer_stems_and_drops_stop_words(tmp_path, encoder):
    docs = [Document("a", "Volcanoes", "Magma erupted from the volcano."), Document("b", "", "The the the and of")]
    build_index(docs, encoder, tmp_path / "en", progress=False)  # default: english
    with SearchIndex.load(tmp_path / "en") as index:
        assert index.manifest.lexical["language"] == "english"
        assert index.search_lexical("erupting volcanoes", 5)[1].tolist() == [0]  # stems meet
        assert index.search_lexical("the of and", 5)[1].tolist() == []  # stop words only


def test_unknown_language_is_refused_before_encoding(tmp_path, encoder):
    with pytest.raises(ValueError, match="no stemmer"):
        build_index(TOY, encoder, tmp_path / "x", progress=False, lexical=LexicalConfig(language="klingon"))
    assert not (tmp_path / "x" / "CURRENT").exists()


def test_an_index_without_lexical_part_says_so(tmp_path, encoder):
    build_index(TOY, encoder, tmp_path / "dense", progress=False, lexical=None)
    with SearchIndex.load(tmp_path / "dense") as index:
        assert not index.has_lexical
        with pytest.raises(ValueError, match="no lexical part"):
            index.search_lexical("banana", 3)


def test_the_query_analyzer_makes_the_terms_bm25s_indexed(tmp_path):
    """The query side splits and stems without bm25s's per-call set-up: same terms as bm25s.tokenize, which
    wrote every segment's postings."""
    import bm25s

    from sieve.index.lexical import Analyzer
    from tests.conftest import DEMO_CORPUS

    texts = [line for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()]
    texts += ["", "the of and", "ÉCOLE naïve Café 123 a1 x", "don't re-index the stop-words!", "Ünïcödé ßtraße 42nd"]
    for language in ("english", "german", "none"):
        analyzer = Analyzer(LexicalConfig(language=language))
        for text in texts:
            expected = bm25s.tokenize([text], stopwords=analyzer.stopwords, stemmer=analyzer.stemmer,
                                      return_ids=False, show_progress=False)
            assert analyzer.terms([text]) == expected, (language, text)


def test_a_large_segment_tokenized_over_processes_gets_the_terms_of_one(monkeypatch):
    """Chunks tokenized in separate processes, their vocabularies merged: every document has the terms bm25s
    gives it in one call, and every term one id."""
    from sieve.index import lexical
    from tests.conftest import DEMO_CORPUS

    texts = [line for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()] * 3 + ["", "the of and"]
    config = LexicalConfig()
    flat, lengths, vocab = lexical.tokenized(texts, config)
    pflat, plengths, pvocab = lexical.TokenizingInParallel(texts, config, 3).result()
    assert plengths.tolist() == lengths.tolist() and len(set(pvocab)) == len(pvocab)
    assert sorted(pvocab) == sorted(vocab)
    assert [pvocab[i] for i in pflat] == [vocab[i] for i in flat]
    monkeypatch.setattr(lexical, "PARALLEL_MIN_DOCS", 10)
    monkeypatch.setattr(lexical, "PARALLEL_CHUNK_DOCS", 4)
    assert lexical.build_processes(9) == 1 and lexical.build_processes(12) == min(len(os.sched_getaffinity(0)), 3)


@pytest.mark.parametrize("failure", ["cannot start", "a process died"])
def test_bm25_tokenizing_falls_back_to_this_process(monkeypatch, caplog, failure):
    """No process pool on this platform, or a tokenizing process killed (OOM): the build's terms come from this
    process instead, the same as always; the encoding done meanwhile is not lost."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from sieve.index import lexical
    from tests.conftest import DEMO_CORPUS

    class Pool:  # stands in for the stdlib executor: fails to start, or its futures fail as a dead process's do
        def __init__(self, *args, **kwargs):
            if failure == "cannot start":
                raise OSError("no /dev/shm")

        def submit(self, *args):
            future = Future()
            future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
            return future

        def shutdown(self, **kwargs):
            pass

    monkeypatch.setattr(lexical, "ProcessPoolExecutor", Pool)
    texts = [line for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()]
    flat, lengths, vocab = lexical.tokenized(texts, LexicalConfig())
    pflat, plengths, pvocab = lexical.TokenizingInParallel(texts, LexicalConfig(), 2).result()
    assert plengths.tolist() == lengths.tolist() and [pvocab[i] for i in pflat] == [vocab[i] for i in flat]
    assert "in this process" in caplog.text


def loop_over_terms(index, query: str) -> np.ndarray:
    """BM25 of every live row, adding term after term, segment after segment (the reference formula)."""
    from sieve.index.lexical import _counted

    parts = index._p
    segments = [s.lexical for s in parts.segments]
    alive = parts.alive if parts.alive is not None else np.ones(int(parts.offsets[-1]), dtype=bool)
    expected = np.zeros(int(parts.offsets[-1]), np.float32)
    avgdl = parts.lexical_stats.total_len / parts.lexical_stats.count
    for term, times in _counted(parts.lexical.terms([query])[0]).items():
        for seg, offset in zip(segments, parts.offsets[:-1].tolist()):
            local, tf = seg.postings(term)
            keep = alive[local + offset]
            local, tf = local[keep], tf[keep]
            df = sum(int(alive[s.postings(term)[0] + o].sum()) for s, o in zip(segments, parts.offsets[:-1].tolist()))
            idf = np.log(1 + (parts.lexical_stats.count - df + 0.5) / (df + 0.5))
            lens = seg.doc_len[local].astype(np.float32)
            norm = tf / (tf + 1.5 * (1 - 0.75 + 0.75 * lens / avgdl))  # float32, as stored per version
            expected[local + offset] += (times * idf * norm).astype(np.float32)
    return expected if parts.live_to_phys is None else expected[parts.live_to_phys]


def test_scores_over_segments_with_deletes_are_those_of_a_loop_over_terms(tmp_path, encoder):
    """BM25 is computed for all query terms at once: bit for bit what adding term after term gives, on several
    segments with deletions (the general path) and on one segment with none (its shortcut: a slice per term)."""
    docs = make_docs(40)
    build_index(docs[:20], encoder, tmp_path / "ix", progress=False)
    build_index(docs, encoder, tmp_path / "one", progress=False)
    add_documents(tmp_path / "ix", docs[20:], {"primary": encoder})
    delete_documents(tmp_path / "ix", [docs[3].id, docs[25].id])
    queries = (docs[5].text, docs[3].text, " ".join(d.text for d in docs[::3]), docs[7].text + " " + docs[7].text,
               "zzz", docs[9].text + " zzz")
    with SearchIndex.load(tmp_path / "ix") as index, SearchIndex.load(tmp_path / "one") as one:
        assert len(index._p.segments) == 2 and index._p.alive is not None
        assert len(one._p.segments) == 1 and one._p.alive is None
        for query in queries:
            for searched in (index, one):
                assert np.array_equal(searched.lexical_scores(query), loop_over_terms(searched, query)), query


def test_top_positive_keeps_ties_in_row_order():
    scores = np.array([0.0, 2.0, 1.0, 2.0, 2.0], dtype=np.float32)
    assert top_positive(scores, 2)[1].tolist() == [1, 3]
    assert top_positive(scores, 10)[1].tolist() == [1, 3, 4, 2]


def test_top_positive_is_the_sort_by_score_then_row():
    """Against the definition (rows with a score > 0, by score descending then row, the first k): ties, signed
    zeros, NaN, infinities, subnormals, k above the positives, float64 scores (which take the lexsort path)."""
    def reference(scores, k):
        rows = sorted((r for r in range(len(scores)) if scores[r] > 0), key=lambda r: (-float(scores[r]), r))[:k]
        return scores[np.array(rows, dtype=np.int64)], np.array(rows, dtype=np.int64)

    rng = np.random.default_rng(4)
    for trial in range(400):
        n = int(rng.choice([0, 1, 2, 9, 300]))
        scores = (rng.standard_normal(n) * 3).astype(np.float32)
        kind = trial % 8
        if kind == 1:
            scores = np.round(scores)  # many ties
        if kind == 2:
            scores[rng.random(n) < 0.3] = -0.0
            scores[rng.random(n) < 0.3] = 0.0
        if kind == 3:
            scores[rng.random(n) < 0.1] = np.nan
        if kind == 4:
            scores[rng.random(n) < 0.1] = np.inf
            scores[rng.random(n) < 0.1] = -np.inf
        if kind == 5:
            scores = np.abs(scores) * np.float32(1e-42)  # subnormal
        if kind == 6:
            scores = scores.astype(np.float64)
        if kind == 7:
            scores = scores[::-1]  # not contiguous
        for k in (1, 3, n, n + 7):
            if k < 1:
                continue
            got, want = top_positive(scores, k), reference(scores, k)
            assert got[1].dtype == np.int64 and got[1].tolist() == want[1].tolist(), (trial, k)
            assert got[0].dtype == scores.dtype and np.array_equal(got[0], want[0]), (trial, k)


def test_every_write_keeps_lexical_and_dense_in_step(tmp_path, encoder):
    path = tmp_path / "live"
    build_index(TOY, encoder, path, progress=False, lexical=PLAIN)
    add_documents(path, [Document("d4", "", "fig banana"), Document("d1", "", "grape")], {"primary": encoder})
    delete_documents(path, ["d0"])
    apply_changes(path, [Document("d5", "", "fig fig")], ["d2"], {"primary": encoder})
    with SearchIndex.load(path) as index:
        ids = index.ids(range(index.size))
        assert ids == ["d3", "d4", "d1", "d5"]  # a replaced document (d1) moves to the write's new segment
        assert [ids[r] for r in index.search_lexical("fig", 5)[1]] == ["d5", "d4"]
        assert index.search_lexical("apple cherry", 5)[1].tolist() == []  # d0 and d2 are gone from both parts
        assert [ids[r] for r in index.search_lexical("grape banana", 5)[1]] == ["d1", "d4"]


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    import sieve.index.{module} as target
    from sieve.index import Document, apply_changes
    from tests.index.conftest import FakeEncoder

    real = target.{function}
    def killed(*args, **kwargs):
        real(*args, **kwargs) if {after!r} else None
        os.kill(os.getpid(), signal.SIGKILL)  # a real crash: no exception handler, no cleanup runs
    target.{function} = killed
    apply_changes({path!r}, [Document("new", "", "zebra quokka")], ["d1"], {{"primary": FakeEncoder()}})
""")


@pytest.mark.parametrize("module,function,after", [
    ("writer", "write_lexical", False),  # dense files staged, BM25 not yet written
    ("writer", "write_lexical", True),  # both staged, nothing published
    ("layout", "_switch_current", False),  # the new version renamed into place, CURRENT not switched
])
def test_a_killed_writer_leaves_both_parts_old(tmp_path, module, function, after):
    from .conftest import FakeEncoder

    path = tmp_path / "killed"
    docs = make_docs(50)
    build_index(docs, FakeEncoder(), path, progress=False)
    script = KILLED_WRITER.format(repo=str(REPO), module=module, function=function, after=after, path=str(path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert read_current(path) == "v000001"
    with SearchIndex.load(path) as index:
        assert index.version == 1 and index.size == 50 and index.has_id("d1") and not index.has_id("new")
        assert index.search_lexical("zebra quokka", 5)[1].tolist() == []
        assert index.ids(index.search_lexical(docs[1].text, 1)[1]) == ["d1"]
    # the next write goes through and moves both parts
    apply_changes(path, [Document("new", "", "zebra quokka")], ["d1"], {"primary": FakeEncoder()})
    with SearchIndex.load(path) as index:
        assert index.ids(index.search_lexical("zebra quokka", 5)[1]) == ["new"] and not index.has_id("d1")
        assert os.path.isdir(index.index_dir / "versions" / f"v{index.version:06d}" / "bm25")


@pytest.mark.parametrize("preset, seen", [(None, "cpu"), ("cuda", "cuda")])
def test_bm25s_import_keeps_jax_off_the_gpu(tmp_path, preset, seen):
    """bm25s runs a JAX top-k at import where JAX is installed, and JAX then takes 75% of the GPU's memory in every
    process: Sieve's analyzer imports bm25s with JAX on the CPU and not preallocating, unless the environment already
    chose (a stand-in `jax` records what it was given when bm25s calls it)."""
    fake = tmp_path / "fake" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "lax.py").write_text(textwrap.dedent(f"""
        import os
        def top_k(x, k):
            open({str(tmp_path / 'seen')!r}, 'w').write(
                os.environ.get('JAX_PLATFORMS', '-') + ' ' + os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', '-'))
            return x, x
    """))
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), str(REPO)])
    if preset:
        env["JAX_PLATFORMS"] = preset
    code = ("from sieve.index.lexical import Analyzer, LexicalConfig; "
            "print(Analyzer(LexicalConfig()).terms(['Running shoes']))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "seen").read_text() == f"{seen} false"
