"""BM25 as sparse vectors, for an engine that keeps the IDF itself (Qdrant's `Modifier.IDF`).

Sieve's analyzer (index/lexical.py: the same tokens, stop words and stemming as the local index) turns a document
into its terms; each term becomes a sparse dimension (a 32-bit hash of the term, so no vocabulary has to be shared
between writers) holding BM25's term-frequency part, tf / (tf + k1 (1 - b + b dl / avgdl)). A query's dimensions
hold how often each term occurs in it. The engine multiplies by the IDF it keeps, ln(1 + (N - df + 0.5) /
(df + 0.5)), Lucene's as in the local index, so a query's score is the local BM25 score.
Where they differ: avgdl is the corpus's at build time (recorded in the collection's metadata and reused for every
later write, where the local index recomputes it over the live documents), and two terms whose hashes collide
share a dimension (about one pair in a 30,000-term vocabulary; they then count as one term).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .lexical import Analyzer, LexicalConfig


def term_dim(term: str) -> int:
    """The sparse dimension of a term: the first 4 bytes of its blake2b, an unsigned 32-bit integer."""
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=4).digest(), "little")


@dataclass(frozen=True)
class SparseBM25:
    config: LexicalConfig
    avgdl: float

    @classmethod
    def fitted(cls, config: LexicalConfig, texts: Sequence[str]) -> "SparseBM25":
        """avgdl of `texts` (the corpus being built)."""
        lengths = [len(t) for t in Analyzer(config).terms(texts)] if texts else [1]
        return cls(config, max(float(np.mean(lengths)), 1e-9))

    def analyzer(self) -> Analyzer:
        return Analyzer(self.config)

    def documents(self, analyzer: Analyzer, texts: Sequence[str]) -> list[tuple[list[int], list[float]]]:
        """Per text: (dimensions, BM25 term-frequency weights); empty lists for a text with no terms."""
        k1, b = self.config.k1, self.config.b
        out = []
        for terms in analyzer.terms(texts):
            counts = counted(terms)
            norm = k1 * (1 - b + b * len(terms) / self.avgdl)
            out.append((list(counts), [tf / (tf + norm) for tf in counts.values()]))
        return out

    @staticmethod
    def query(analyzer: Analyzer, text: str) -> tuple[list[int], list[float]]:
        counts = counted(analyzer.terms([text])[0])
        return list(counts), [float(n) for n in counts.values()]


def counted(terms: Sequence[str]) -> dict[int, float]:
    """Term counts by dimension (colliding terms add up)."""
    counts: dict[int, float] = {}
    for term in terms:
        dim = term_dim(term)
        counts[dim] = counts.get(dim, 0.0) + 1.0
    return counts
