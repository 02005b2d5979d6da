"""Pseudo-queries made from a corpus's documents alone (for `sieve adapt`): each one names its source document.

Generators (pure functions of a document, the corpus statistics and a seeded random generator):
  title     the document's title (none for documents without one)
  sentence  one sentence of the text, picked at random (inverse cloze: the sentence stands for a question the
            document answers); very short sentences are passed over, very long ones are cut into word windows
  span      a window of 8-24 words cropped from the text at a random place
  terms     3-6 of the document's most salient terms (highest tf x idf over the corpus), in the order they occur:
            the shape of a short keyword query
  mix       each document gets one of sentence / span / terms (title where it has one) at random
  ict       inverse cloze proper: a sentence is the query and the source document is seen *without* it (its
            vector and BM25 are recomputed from the rest: `rest`), so the query is not a quote of its positive
            and the model cannot win by exact match alone
  block     ict with a longer query: a run of consecutive sentences (a third to a half of the sentences)
            is the query and the source is seen without them; the shape of argument-length queries (ArguAna's
            real queries average 190 words)
Sentences come from sentencex (rule-based, no model: lower-case text and sentences ending " ." split as well as
capitalised prose). Text a rule cannot split (no punctuation, run-on sentences) is cut into windows of about
WINDOW words that stand for sentences (`parts`), so every generator works on any text of at least 2 x MIN_WORDS
words.
No generative model: no package here ships the weights of one (and nothing is downloaded at run time).
`query_stats` says how close a set of queries looks to real ones: length and the share of their terms found in
the source (or relevant) document.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import sentencex

from sieve.index.corpus import Document
from sieve.training.choices import GENERATORS

_WORD_RE = re.compile(r"\S+")
_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")  # the words bm25s's tokenizer keeps
MIN_WORDS, MAX_WORDS = 4, 40  # a sentence query's length in words: shorter says too little, longer is cut up
WINDOW = 20  # words in a window standing for a sentence (about a SciFact abstract's median sentence)
# sentencex's language codes for the BM25 analyzer's languages (LexicalConfig.language); others split as English
LANGUAGES = {"arabic": "ar", "basque": "eu", "catalan": "ca", "danish": "da", "dutch": "nl", "english": "en",
             "finnish": "fi", "french": "fr", "german": "de", "greek": "el", "hindi": "hi", "hungarian": "hu",
             "indonesian": "id", "irish": "ga", "italian": "it", "lithuanian": "lt", "nepali": "ne",
             "norwegian": "no", "portuguese": "pt", "romanian": "ro", "russian": "ru", "serbian": "sr",
             "spanish": "es", "swedish": "sv", "tamil": "ta", "turkish": "tr"}


@dataclass(frozen=True)
class PseudoQuery:
    text: str
    source: int  # position of the source document in the corpus list
    rest: str | None = None  # the source document as training sees it when that is not the stored one (ict)


class TermStats:
    """Document frequencies of the analyzer's terms over the corpus (salient terms and overlap need them)."""

    def __init__(self, analyzer, docs: Sequence[Document]):
        self.analyzer = analyzer
        self.doc_terms = analyzer.terms([d.full_text for d in docs])
        self.df = Counter(t for terms in self.doc_terms for t in set(terms))
        self.n = max(len(docs), 1)
        self.avgdl = max(sum(map(len, self.doc_terms)) / self.n, 1e-9)
        self.language = LANGUAGES.get(getattr(analyzer.config, "language", None) or "", "en")

    def idf(self, term: str) -> float:
        return math.log(1 + (self.n - self.df.get(term, 0) + 0.5) / (self.df.get(term, 0) + 0.5))

    def bm25(self, query: str, text: str) -> float:
        """Lucene BM25 of `text` as one document of this corpus (its statistics), as the index scores."""
        k1, b, avgdl = self.analyzer.config.k1, self.analyzer.config.b, self.avgdl
        terms = Counter(self.analyzer.terms([text])[0])
        length = sum(terms.values())
        return float(sum(times * self.idf(t) * terms[t] / (terms[t] + k1 * (1 - b + b * length / avgdl))
                         for t, times in Counter(self.analyzer.terms([query])[0]).items() if t in terms))


def title_query(doc: Document, rng: random.Random, stats: TermStats, row: int) -> str | None:
    return doc.title.strip() or None


def windows(words: Sequence[str], count: int) -> list[str]:
    """`words` cut into `count` consecutive windows of (nearly) equal length."""
    bounds = np.linspace(0, len(words), count + 1).round().astype(int)
    return [" ".join(words[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def parts(text: str, language: str = "en") -> list[str]:
    """The text as consecutive parts that stand for sentences, nothing left out: its sentences (sentencex), each
    one longer than MAX_WORDS cut into windows of about WINDOW words; a text that gives fewer than two parts (no
    punctuation) is cut into windows of about WINDOW words, at least two when it has 2 x MIN_WORDS words."""
    found = []
    for sentence in sentencex.segment(language, text):
        words = sentence.split()
        if len(words) > MAX_WORDS:
            found += windows(words, round(len(words) / WINDOW))
        elif words:
            found.append(" ".join(words))
    words = text.split()
    if len(found) < 2 and len(words) >= 2 * MIN_WORDS:
        found = windows(words, max(2, round(len(words) / WINDOW)))
    return found


def sentences(text: str, language: str = "en") -> list[str]:
    """The parts a sentence query may be: those of MIN_WORDS to MAX_WORDS words."""
    return [p for p in parts(text, language) if MIN_WORDS <= len(p.split()) <= MAX_WORDS]


def sentence_query(doc: Document, rng: random.Random, stats: TermStats, row: int) -> str | None:
    found = sentences(doc.text, stats.language)
    return rng.choice(found) if found else None


def span_query(doc: Document, rng: random.Random, stats: TermStats, row: int) -> str | None:
    words = _WORD_RE.findall(doc.text)
    if len(words) < 8:
        return None
    length = rng.randint(8, min(24, len(words)))
    start = rng.randint(0, len(words) - length)
    return " ".join(words[start:start + length])


def terms_query(doc: Document, rng: random.Random, stats: TermStats, row: int) -> str | None:
    """The most salient terms, each written as the first word of the text that the analyzer turns into it, in
    text order: reads like words a person would type (the analyzer stems them again at search time)."""
    terms = stats.doc_terms[row]
    if len(set(terms)) < 3:
        return None
    counts = Counter(terms)
    ranked = sorted(counts, key=lambda t: (-counts[t] * stats.idf(t), t))
    picked = set(ranked[:rng.randint(3, 6)])
    words = _TOKEN_RE.findall(doc.full_text)
    stemmer = stats.analyzer.stemmer
    stems = stemmer.stemWords([w.lower() for w in words]) if stemmer else [w.lower() for w in words]
    out, seen = [], set()
    for word, stem in zip(words, stems):
        if stem in picked and stem not in seen:
            seen.add(stem)
            out.append(word)
    return " ".join(out) or None


def ict_query(doc: Document, rng: random.Random, stats: TermStats, row: int) -> PseudoQuery | None:
    found = parts(doc.text, stats.language)
    allowed = [i for i, p in enumerate(found) if MIN_WORDS <= len(p.split()) <= MAX_WORDS]
    if len(found) < 2 or not allowed:  # the rest must still say something
        return None
    picked = rng.choice(allowed)
    rest = " ".join(found[:picked] + found[picked + 1:])
    return PseudoQuery(found[picked], row, f"{doc.title} {rest}".strip())


def block_query(doc: Document, rng: random.Random, stats: TermStats, row: int) -> PseudoQuery | None:
    found = parts(doc.text, stats.language)
    if len(found) < 3:  # the rest must keep at least half of the text
        return None
    size = rng.randint(max(1, len(found) // 3), max(1, len(found) // 2))
    start = rng.randint(0, len(found) - size)
    rest = " ".join(found[:start] + found[start + size:])
    return PseudoQuery(" ".join(found[start:start + size]), row, f"{doc.title} {rest}".strip())


def mix_query(doc: Document, rng: random.Random, stats: TermStats, row: int) -> str | None:
    choices = [sentence_query, span_query, terms_query] + ([title_query] if doc.title.strip() else [])
    rng.shuffle(choices)
    for make in choices:
        if (text := make(doc, rng, stats, row)) is not None:
            return text
    return None


_MAKERS: dict[str, Callable] = {"title": title_query, "sentence": sentence_query, "span": span_query,
                                "terms": terms_query, "mix": mix_query, "ict": ict_query,
                                "block": block_query}


def generate(generator: str, docs: Sequence[Document], rows: Sequence[int], stats: TermStats, per_doc: int = 1,
             seed: int = 0) -> list[PseudoQuery]:
    """Up to `per_doc` pseudo-queries for each of `rows` (documents that yield none are skipped)."""
    if generator not in _MAKERS:
        raise ValueError(f"unknown pseudo-query generator {generator!r}; allowed: {', '.join(GENERATORS)}")
    make, rng = _MAKERS[generator], random.Random(seed)
    out = []
    for row in rows:
        made = [make(docs[row], rng, stats, row) for _ in range(per_doc)]
        made = [m if isinstance(m, PseudoQuery) else PseudoQuery(m, row) for m in made if m]
        out += list({m.text: m for m in made}.values())
    return out


def query_stats(queries: Sequence[str], sources: Sequence[Sequence[int]], stats: TermStats,
                rests: Sequence[str | None] | None = None) -> dict:
    """Mean and median length (words) of the queries, and the mean share of each query's analyzer terms that occur
    in its source document(s) (in `rests[i]` where given: the source as training sees it)."""
    lengths = np.array([len(q.split()) for q in queries], dtype=np.float64)
    overlaps = []
    for i, (query, rows) in enumerate(zip(queries, sources)):
        terms = set(stats.analyzer.terms([query])[0])
        if terms:
            rest = rests[i] if rests is not None else None
            doc_terms = set(stats.analyzer.terms([rest])[0]) if rest else set().union(*(stats.doc_terms[r] for r in rows))
            overlaps.append(len(terms & doc_terms) / len(terms))
    return {"queries": len(queries), "words_mean": round(float(lengths.mean()), 2) if len(lengths) else 0.0,
            "words_median": float(np.median(lengths)) if len(lengths) else 0.0,
            "term_overlap": round(float(np.mean(overlaps)), 3) if overlaps else 0.0}
