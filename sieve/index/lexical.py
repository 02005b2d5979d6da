"""The lexical part of an index: BM25 over each document's title + text, one postings list per segment.

Each segment (index/segments.py) keeps its own term frequencies under SEGMENT/bm25/ (vocab.json, indptr.npy,
docs.npy, tfs.npy, doc_len.npy, all memory-mapped), written with the segment's dense files before the version is
published, so a crash or a reload always sees both old or both new. Scores are computed at query time from the
statistics of the live documents of ALL segments (N, document frequency, average length; deleted rows excluded), so
a write that adds a small segment changes no other document's IDF beyond what a full rebuild would: the scores are
exactly those of one BM25 index over the live documents (Lucene's formula, as bm25s computes it).
The analyzer is bm25s's tokenizer (lower-casing, a word regex), a language's stop words and PyStemmer's stemmer;
`language: "none"` keeps every token as written.
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np

LEXICAL_DIR = "bm25"
ENGINE = "bm25s"
TOKEN_PATTERN = r"(?u)\b\w\w+\b"  # bm25s.tokenize's default (scikit-learn's CountVectorizer)
NO_LANGUAGE = "none"
log = logging.getLogger("sieve")
# a segment of at least PARALLEL_MIN_DOCS documents is tokenized in several processes, each given at least
# PARALLEL_CHUNK_DOCS: the tokenizer's Python took 5.5 s for 46,647 SciFact abstracts on one Zen 4 core, and a
# process starts in about 0.3 s (RESULTS.md, issue 32)
PARALLEL_MIN_DOCS = 20_000
PARALLEL_CHUNK_DOCS = 5_000
# bm25s's own stop-word lists and PyStemmer's stemmers, by the name a user writes in settings
_STOPWORDS = {"english": "en", "german": "de", "dutch": "nl", "french": "fr", "spanish": "es", "portuguese": "pt",
              "italian": "it", "russian": "ru", "swedish": "sv", "norwegian": "no", "chinese": "zh"}


@dataclass(frozen=True)
class LexicalConfig:
    """What the manifest records of the lexical part; the same analyzer must run at build and at query time."""
    language: str = "english"
    k1: float = 1.5
    b: float = 0.75
    engine: str = ENGINE

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "LexicalConfig":
        return cls(**{k: data[k] for k in ("language", "k1", "b", "engine") if k in data})

    def check(self) -> None:
        if self.engine != ENGINE:
            raise ValueError(f"lexical engine {self.engine!r} is not supported; allowed: {ENGINE}")
        if self.language != NO_LANGUAGE:
            import Stemmer

            if self.language not in Stemmer.algorithms():
                raise ValueError(f"lexical language {self.language!r} has no stemmer; allowed: {NO_LANGUAGE}, "
                                 f"{', '.join(sorted(Stemmer.algorithms()))}")


class Analyzer:
    """Text -> BM25 terms, as bm25s.tokenize makes them at build time (write_lexical): lower-cased, its word regex,
    the language's stop words dropped, PyStemmer's stems (tests/index/test_lexical.py checks the two agree). Done
    here without bm25s's per-call set-up, which cost more than the work for one query. Thread-safe: PyStemmer's
    stemWords runs under the interpreter lock and keeps nothing between calls that changes its answer."""

    def __init__(self, config: LexicalConfig):
        config.check()
        self.config = config
        self.stopwords = _STOPWORDS.get(config.language, []) if config.language != NO_LANGUAGE else []
        self.stemmer = None
        if config.language != NO_LANGUAGE:
            import Stemmer

            self.stemmer = Stemmer.Stemmer(config.language)
        _infer_stopwords = bm25s_module().tokenization._infer_stopwords

        self.stopword_set = frozenset(_infer_stopwords(self.stopwords))
        self.split = re.compile(TOKEN_PATTERN).findall

    def terms(self, texts: Sequence[str]) -> list[list[str]]:
        out = []
        for text in texts:
            tokens = [t for t in self.split(text.lower()) if t not in self.stopword_set]
            out.append(self.stemmer.stemWords(tokens) if self.stemmer is not None and tokens else tokens)
        return out


def bm25s_module():
    """bm25s, imported with JAX kept on the CPU. When JAX is installed, bm25s runs a JAX top-k at import, and JAX then
    takes 75% of the GPU's free memory for itself (XLA's preallocation) in every process that imports it: on an H200
    the eight workers of `sieve serve` failed to start (out of memory, CUBLAS_STATUS_ALLOC_FAILED) and one worker held
    105 GiB it never used (benchmarks/results/gpu_nvidia_h200.json). Sieve uses bm25s only to tokenize, so JAX is
    put on the CPU (JAX_PLATFORMS=cpu) and told not to preallocate, unless the environment already says otherwise."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s

    return bm25s


def tokenized(texts: Sequence[str], config: LexicalConfig) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """bm25s.tokenize of `texts` as arrays: (every text's term ids one after another (T,), each text's count of
    terms (N,), the terms by id)."""
    bm25s = bm25s_module()
    analyzer = Analyzer(config)
    tokens = bm25s.tokenize(list(texts), stopwords=analyzer.stopwords, stemmer=analyzer.stemmer, return_ids=True,
                            show_progress=False)
    vocab = [""] * len(tokens.vocab)
    for term, tid in tokens.vocab.items():
        vocab[tid] = term
    lengths = np.fromiter(map(len, tokens.ids), np.int64, len(tokens.ids))
    flat = np.fromiter(chain.from_iterable(tokens.ids), np.int64, int(lengths.sum()))
    return flat, lengths, vocab


def build_processes(n_docs: int) -> int:
    """Processes that tokenize a build of n_docs documents (`sieve index build`): one per CPU this process may use,
    at most one per PARALLEL_CHUNK_DOCS documents; 1 (no process started) below PARALLEL_MIN_DOCS, where starting
    them costs more than it saves."""
    if n_docs < PARALLEL_MIN_DOCS:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, n_docs // PARALLEL_CHUNK_DOCS))


class TokenizingInParallel:
    """tokenized(texts, config) over `processes` processes started now, a chunk of texts each (bm25s's tokenizer is
    pure Python, one core per process), so the caller can encode meanwhile; `result()` waits for them and maps each
    chunk's ids into one vocabulary, numbered in order of first appearance over the chunks (the same terms as one
    call). The processes are spawned (fresh interpreters, whatever threads torch or CUDA run in this one), so like
    any multiprocessing code it needs a program whose main module is guarded by `if __name__ == "__main__"`."""

    def __init__(self, texts: Sequence[str], config: LexicalConfig, processes: int):
        self.texts, self.config = texts, config
        size = -(-len(texts) // max(processes, 1))
        chunks = [list(texts[i:i + size]) for i in range(0, len(texts), size)] or [[]]
        self.pool, self.futures = None, []
        try:
            self.pool = ProcessPoolExecutor(len(chunks), mp_context=multiprocessing.get_context("spawn"))
            self.futures = [self.pool.submit(tokenized, chunk, config) for chunk in chunks]
        except (OSError, NotImplementedError, BrokenProcessPool) as exc:  # no processes here: after the encoding
            log.warning("BM25 tokenizing stays in this process (%s: %s)", type(exc).__name__, exc)
            self.shutdown()

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
        self.pool = None

    def result(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """The merged terms; tokenized in this process instead when the processes could not start or one of them
        died (a build's encoding is not lost to a tokenizer process)."""
        if self.pool is None:
            return tokenized(self.texts, self.config)
        try:
            parts = [future.result() for future in self.futures]
        except BrokenProcessPool as exc:
            log.warning("a BM25 tokenizing process died (%s): tokenizing in this process", exc)
            return tokenized(self.texts, self.config)
        finally:
            self.shutdown()
        ids: dict[str, int] = {}
        flats, lengths = [], []
        for flat, counts, vocab in parts:
            remap = np.fromiter((ids.setdefault(term, len(ids)) for term in vocab), np.int64, len(vocab))
            flats.append(remap[flat])
            lengths.append(counts)
        return np.concatenate(flats), np.concatenate(lengths), list(ids)


def write_lexical(segment_dir: Path, docs, config: LexicalConfig,
                  terms: tuple[np.ndarray, np.ndarray, list[str]] | None = None) -> None:
    """Term frequencies of `docs` (rows in their order) under segment_dir/bm25 (the caller fsyncs); `terms`: what
    tokenized() gives for their texts, when the caller has it already (a build tokenizes while it encodes)."""
    flat, lengths, vocab = terms if terms is not None else tokenized([d.full_text for d in docs], config)
    rows = np.repeat(np.arange(len(docs), dtype=np.int64), lengths)
    n = max(len(docs), 1)
    keys, tfs = np.unique(flat * n + rows, return_counts=True)  # sorted by (term, row)
    term_of, row_of = np.divmod(keys, n)
    doc_len = lengths.astype(np.float32)
    out = segment_dir / LEXICAL_DIR
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(list(vocab)), encoding="utf-8")
    np.save(out / "indptr.npy", np.searchsorted(term_of, np.arange(len(vocab) + 1)).astype(np.int64))
    np.save(out / "docs.npy", row_of.astype(np.int32))
    np.save(out / "tfs.npy", np.minimum(tfs, np.iinfo(np.uint16).max).astype(np.uint16))
    np.save(out / "doc_len.npy", doc_len)


class LexicalSegment:
    """The postings of one segment, memory-mapped, read-only, shared by threads and by index versions."""

    def __init__(self, segment_dir: Path, count: int):
        root = segment_dir / LEXICAL_DIR
        terms = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
        self.vocab = {t: i for i, t in enumerate(terms)}
        # plain arrays over the maps: np.memmap's subclass hooks cost more than a query's slicing itself
        self.indptr = np.asarray(np.load(root / "indptr.npy", mmap_mode="r"))
        self.docs = np.asarray(np.load(root / "docs.npy", mmap_mode="r"))
        self.tfs = np.asarray(np.load(root / "tfs.npy", mmap_mode="r"))
        self.doc_len = np.asarray(np.load(root / "doc_len.npy", mmap_mode="r"))
        if len(self.doc_len) != count or len(self.indptr) != len(terms) + 1:
            from .errors import IndexFormatError

            raise IndexFormatError(f"{root} holds {len(self.doc_len)} documents, the manifest says {count}; "
                                   "rebuild with `sieve index build`")

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(local rows, term frequencies) of the documents holding `term`."""
        tid = self.vocab.get(term)
        if tid is None:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        lo, hi = int(self.indptr[tid]), int(self.indptr[tid + 1])
        return np.asarray(self.docs[lo:hi], dtype=np.int64), np.asarray(self.tfs[lo:hi], dtype=np.float32)

    def positions_of(self, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Where every posting of `terms` lies in this segment's postings, term by term: (positions, position of its
        term in `terms`)."""
        known = [(i, tid) for i, tid in enumerate(map(self.vocab.get, terms)) if tid is not None]
        if not known:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        which, tids = np.array(known, dtype=np.int64).T  # (T,), (T,)
        lo, n = self.indptr[tids], self.indptr[tids + 1] - self.indptr[tids]  # (T,)
        at = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))  # (P,) positions in the postings
        return at, np.repeat(which, n)

    def tf_norm(self, k1: float, b: float, avgdl: float) -> np.ndarray:
        """(postings,) float32: each posting's tf / (tf + k1 (1 - b + b len / avgdl)), BM25's term-frequency part."""
        tfs, lens = self.tfs.astype(np.float32), self.doc_len[self.docs].astype(np.float32)
        return tfs / (tfs + k1 * (1 - b + b * lens / avgdl))


@dataclass(frozen=True)
class LiveStats:
    """The live rows of a version, as BM25 needs them: which physical rows count, their total length, and each
    segment's length-normalised term frequencies (`tf_norm`), which depend on the average length and so on the
    version."""
    alive: np.ndarray | None  # (total physical rows,) bool, None = every row is live
    count: int
    total_len: float
    tf_norm: tuple[np.ndarray, ...] = ()  # per segment, (postings,) float32: tf / (tf + k1 (1 - b + b len / avgdl))
    # one segment with nothing deleted (a version as built): each term's idf ((terms,) float64) and each posting's
    # score for a term the query holds once ((postings,) float32, idf x tf_norm rounded as a query's sum rounds it)
    idf: np.ndarray | None = None
    posting_scores: np.ndarray | None = None


def live_stats(segments: Sequence[LexicalSegment], alive: np.ndarray | None,
               config: LexicalConfig = LexicalConfig()) -> LiveStats:
    """Computed once per version as it loads (O(postings), 4-8 ms for SciFact's 0.5 M postings; 4 bytes of memory per
    posting, 8 for a single segment with nothing deleted, whose postings' scores are stored too), so a query
    multiplies one stored factor per posting instead of normalising every posting again."""
    lengths = np.concatenate([np.asarray(s.doc_len, dtype=np.float64) for s in segments])
    count = len(lengths) if alive is None else int(alive.sum())
    total = float(lengths.sum() if alive is None else lengths[alive].sum())
    avgdl = max(total / count, 1e-9) if count else 1.0
    tf_norm = tuple(s.tf_norm(config.k1, config.b, avgdl) for s in segments)
    if len(segments) != 1 or alive is not None:
        return LiveStats(alive, count, total, tf_norm)
    df = np.diff(segments[0].indptr)  # (terms,) the documents holding each term: its postings
    idf = _idf(df, count)
    scores = np.repeat(idf, df)  # (postings,) float64, term by term as the postings lie
    np.multiply(scores, tf_norm[0], out=scores)
    return LiveStats(alive, count, total, tf_norm, idf, scores.astype(np.float32))


def bm25_scores(analyzer: Analyzer, segments: Sequence[LexicalSegment], offsets: Sequence[int], stats: LiveStats,
                query: str) -> np.ndarray:
    """BM25 of every physical row for `query` (0 for deleted rows and rows sharing no term): Lucene's idf over the
    live documents of all segments, times each posting's `stats.tf_norm`."""
    total_rows = offsets[-1] + len(segments[-1].doc_len) if segments else 0
    out = np.zeros(total_rows, dtype=np.float32)
    counted = _counted(analyzer.terms([query])[0])
    if stats.count == 0 or not counted:
        return out
    if stats.posting_scores is not None:  # one segment, nothing deleted
        return _one_segment_scores(segments[0], stats, counted, out)
    rows, norms, term = _postings(segments, offsets, stats.tf_norm, list(counted))  # (P,) each, term by term
    if stats.alive is not None:
        keep = stats.alive[rows]
        rows, norms, term = rows[keep], norms[keep], term[keep]
    weight = _term_weights(counted, np.bincount(term, minlength=len(counted)), stats.count)  # (T,)
    score = (weight[term] * norms).astype(np.float32)  # (P,)
    np.add.at(out, rows, score)  # in float32, term after term: the sums a loop over the terms makes
    return out


def _term_weights(counted: dict[str, int], df: np.ndarray, count: int) -> np.ndarray:
    """(T,) float64: Lucene's idf of each query term (df: the live documents holding it, of `count`) times how often
    the term is in the query."""
    return np.fromiter(counted.values(), np.float64, len(counted)) * _idf(df, count)


def _idf(df: np.ndarray, count: int) -> np.ndarray:
    """Lucene's idf (float64) of terms held by `df` of `count` live documents."""
    return np.log(1 + (count - df + 0.5) / (df + 0.5))


def _one_segment_scores(seg: LexicalSegment, stats: LiveStats, counted: dict[str, int], out: np.ndarray) -> np.ndarray:
    """bm25_scores() of one segment with nothing deleted: each term's postings are one slice, its document frequency
    the slice's length, and each posting's score for a term the query holds once is stored (`stats.posting_scores`,
    made as the version loads); a term held c times scores c x idf x tf_norm as the general path does. The same
    float operations in the same order as the general path (the same bits, tested): 57 -> 31 us per SciFact query
    (AMD Zen 3 host; 89 -> 63 us on an Intel host with AMX before the scores were stored)."""
    rows, scores = [], []
    for term, times in counted.items():
        tid = seg.vocab.get(term)
        if tid is None:
            continue
        lo, hi = seg.indptr[tid:tid + 2].tolist()
        rows.append(seg.docs[lo:hi])
        scores.append(stats.posting_scores[lo:hi] if times == 1 else
                      (times * stats.idf[tid] * stats.tf_norm[0][lo:hi]).astype(np.float32))
    if rows:
        np.add.at(out, np.concatenate(rows), np.concatenate(scores))  # in float32, term after term
    return out


def _postings(segments: Sequence[LexicalSegment], offsets: Sequence[int], tf_norm: Sequence[np.ndarray],
              terms: list[str]):
    """(physical rows, normalised term frequencies, term position) of every posting of `terms`, ordered by term."""
    parts = []
    for seg, offset, norm in zip(segments, offsets, tf_norm):
        at, term = seg.positions_of(terms)
        parts.append((seg.docs[at].astype(np.int64) + offset, norm[at], term))
    rows, norms, term = (np.concatenate(column) if len(parts) > 1 else column[0] for column in zip(*parts))
    if len(parts) > 1:  # segment after segment -> term after term, each term's postings in segment order
        order = np.argsort(term, kind="stable")
        rows, norms, term = rows[order], norms[order], term[order]
    return rows, norms, term


def _counted(terms: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    return counts


class LexicalIndex:
    """BM25 over one directory's documents (a single segment with no deletions): the standalone use."""

    def __init__(self, version_dir: Path, config: LexicalConfig, count: int):
        self.config = config
        self.analyzer = Analyzer(config)
        self.segment = LexicalSegment(version_dir, count)
        self.stats = live_stats([self.segment], None, config)
        self.count = count

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every row for `query` (float32, 0 where no query term occurs)."""
        return bm25_scores(self.analyzer, [self.segment], [0], self.stats, query)

    def search(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows by BM25 with a positive score, best first: (scores float32, rows int64)."""
        return top_positive(self.scores(query), k)


def top_positive(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best rows with a score > 0, best first, ties broken by row (the same query gives the same list).
    float32 scores take one sort of unique int64 keys: the score's bits above (a positive float32 orders as its
    bits do), the row below (15 against 49 us for SciFact's 5,183 rows, k = 512); any other input, or a positive
    NaN, the sort by score then row (the same rows, tests/index/test_lexical.py)."""
    if scores.dtype != np.float32 or scores.ndim != 1 or k < 1 or len(scores) >= 1 << 31:
        return _top_positive_by_lexsort(scores, k)
    keys = scores.view(np.int32).astype(np.int64)
    keys <<= 32
    keys = np.subtract(row_numbers(len(scores)), keys, out=keys)  # row - bits * 2**32: ascending = best first,
    # ties by row; a score > 0 has bits >= 1, so its key is < 0, and any other score's key is >= 0
    if k < len(keys):
        keys = np.partition(keys, k - 1)[:k]  # the k smallest, in no order
    keys.sort()
    if len(keys) and keys[0] < _NAN_KEYS:  # a positive NaN's bits are above +inf's, so it would come first
        return _top_positive_by_lexsort(scores, k)
    rows = keys[:np.searchsorted(keys, 0)] & 0xFFFF_FFFF  # the positive scores' rows (low 32 bits)
    return scores[rows], rows


_NAN_KEYS = -(0x7F80_0000 << 32)  # keys below this one: scores whose bits are above +inf's (positive NaNs)


@lru_cache(maxsize=8)
def row_numbers(n: int) -> np.ndarray:
    """0 .. n-1 as int64, read-only and shared (top_positive's keys, rrf_fuse's positions)."""
    rows = np.arange(n, dtype=np.int64)
    rows.flags.writeable = False
    return rows


def _top_positive_by_lexsort(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    hits = np.flatnonzero(scores > 0)
    if len(hits) > k:
        kth = np.partition(scores[hits], len(hits) - k)[len(hits) - k]  # k-th best value: keep every tie with it
        hits = hits[scores[hits] >= kth]
    order = np.lexsort((hits, -scores[hits]))[:k]
    rows = hits[order].astype(np.int64)
    return scores[rows], rows
