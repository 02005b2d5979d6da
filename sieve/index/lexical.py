"""The lexical part of an index version: BM25 over each document's title + text, kept by `bm25s`.

It is written inside the same version directory as the dense part (DIR/versions/vNNNNNN/bm25/), from the same
document list, before the version is published, so a crash or a reload always sees both old or both new.
The analyzer is bm25s's tokenizer (lower-casing, a word regex), a language's stop words and PyStemmer's stemmer;
`language: "none"` keeps every token as written.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
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


def write_lexical(version_dir: Path, docs, config: LexicalConfig) -> None:
    """Build BM25 over `docs` (rows in their order) and save it under version_dir/bm25 (the caller fsyncs)."""
    import bm25s

    terms = Analyzer(config).terms([d.full_text for d in docs])
    retriever = bm25s.BM25(k1=config.k1, b=config.b)
    retriever.index(terms, show_progress=False)
    retriever.save(str(version_dir / LEXICAL_DIR))


class LexicalIndex:
    """A loaded BM25 part: row-aligned with the dense part of the same version, read-only, shared by threads."""

    def __init__(self, version_dir: Path, config: LexicalConfig, count: int):
        import bm25s

        self.config = config
        self.analyzer = Analyzer(config)
        self.retriever = bm25s.BM25.load(str(version_dir / LEXICAL_DIR), mmap=True)
        n = int(self.retriever.scores["num_docs"])
        if n != count:
            from .errors import IndexFormatError

            raise IndexFormatError(f"{version_dir / LEXICAL_DIR} holds {n} documents, the manifest says {count}; "
                                   "rebuild with `sieve index build`")
        self.count = count

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every row for `query` (float32, 0 where no query term occurs)."""
        terms = self.analyzer.terms([query])[0]
        if not terms:
            return np.zeros(self.count, dtype=np.float32)
        return np.asarray(self.retriever.get_scores(terms), dtype=np.float32)

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
