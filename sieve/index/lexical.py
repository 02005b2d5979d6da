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
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np

LEXICAL_DIR = "bm25"
ENGINE = "bm25s"
NO_LANGUAGE = "none"
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
    """Text -> BM25 terms. Thread-safe: PyStemmer's stemmer is used under bm25s's tokenize, which keeps no state
    between calls when it returns strings."""

    def __init__(self, config: LexicalConfig):
        config.check()
        self.config = config
        self.stopwords = _STOPWORDS.get(config.language, []) if config.language != NO_LANGUAGE else []
        self.stemmer = None
        if config.language != NO_LANGUAGE:
            import Stemmer

            self.stemmer = Stemmer.Stemmer(config.language)

    def terms(self, texts: Sequence[str]) -> list[list[str]]:
        import bm25s

        return bm25s.tokenize(list(texts), stopwords=self.stopwords, stemmer=self.stemmer, return_ids=False,
                              show_progress=False)


def write_lexical(segment_dir: Path, docs, config: LexicalConfig) -> None:
    """Term frequencies of `docs` (rows in their order) under segment_dir/bm25 (the caller fsyncs)."""
    import bm25s

    analyzer = Analyzer(config)
    tokens = bm25s.tokenize([d.full_text for d in docs], stopwords=analyzer.stopwords, stemmer=analyzer.stemmer,
                            return_ids=True, show_progress=False)
    vocab = [""] * len(tokens.vocab)
    for term, tid in tokens.vocab.items():
        vocab[tid] = term
    lengths = np.fromiter(map(len, tokens.ids), np.int64, len(tokens.ids))
    flat = np.fromiter(chain.from_iterable(tokens.ids), np.int64, int(lengths.sum()))
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
        self.indptr = np.load(root / "indptr.npy", mmap_mode="r")
        self.docs = np.load(root / "docs.npy", mmap_mode="r")
        self.tfs = np.load(root / "tfs.npy", mmap_mode="r")
        self.doc_len = np.load(root / "doc_len.npy", mmap_mode="r")
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


@dataclass(frozen=True)
class LiveStats:
    """The live rows of a version, as BM25 needs them: which physical rows count, and their total length."""
    alive: np.ndarray | None  # (total physical rows,) bool, None = every row is live
    count: int
    total_len: float


def live_stats(segments: Sequence[LexicalSegment], alive: np.ndarray | None) -> LiveStats:
    lengths = np.concatenate([np.asarray(s.doc_len, dtype=np.float64) for s in segments])
    count = len(lengths) if alive is None else int(alive.sum())
    total = float(lengths.sum() if alive is None else lengths[alive].sum())
    return LiveStats(alive, count, total)


def bm25_scores(analyzer: Analyzer, segments: Sequence[LexicalSegment], offsets: Sequence[int], stats: LiveStats,
                query: str) -> np.ndarray:
    """BM25 of every physical row for `query` (0 for deleted rows and rows sharing no term): Lucene's idf over the
    live documents of all segments."""
    total_rows = offsets[-1] + len(segments[-1].doc_len) if segments else 0
    out = np.zeros(total_rows, dtype=np.float32)
    if stats.count == 0:
        return out
    k1, b, avgdl = analyzer.config.k1, analyzer.config.b, max(stats.total_len / stats.count, 1e-9)
    for term, times in _counted(analyzer.terms([query])[0]).items():
        rows, tfs, lens = [], [], []
        for seg, offset in zip(segments, offsets):
            local, tf = seg.postings(term)
            rows.append(local + offset)
            tfs.append(tf)
            lens.append(np.asarray(seg.doc_len[local], dtype=np.float32))
        rows, tfs, lens = np.concatenate(rows), np.concatenate(tfs), np.concatenate(lens)
        if stats.alive is not None:
            keep = stats.alive[rows]
            rows, tfs, lens = rows[keep], tfs[keep], lens[keep]
        if len(rows) == 0:
            continue
        df = len(rows)
        idf = np.log(1 + (stats.count - df + 0.5) / (df + 0.5))
        out[rows] += (times * idf * tfs / (tfs + k1 * (1 - b + b * lens / avgdl))).astype(np.float32)
    return out


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
        self.stats = live_stats([self.segment], None)
        self.count = count

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every row for `query` (float32, 0 where no query term occurs)."""
        return bm25_scores(self.analyzer, [self.segment], [0], self.stats, query)

    def search(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows by BM25 with a positive score, best first: (scores float32, rows int64)."""
        return top_positive(self.scores(query), k)


def top_positive(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best rows with a score > 0, best first, ties broken by row (the same query gives the same list)."""
    hits = np.flatnonzero(scores > 0)
    if len(hits) > k:
        kth = np.partition(scores[hits], len(hits) - k)[len(hits) - k]  # k-th best value: keep every tie with it
        hits = hits[scores[hits] >= kth]
    order = np.lexsort((hits, -scores[hits]))[:k]
    rows = hits[order].astype(np.int64)
    return scores[rows], rows
