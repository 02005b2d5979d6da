"""A BEIR split made ready for training: corpus, judged queries, and the bi-encoder's vectors for both."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sieve.index import Document, read_beir_corpus, read_qrels, read_queries
from sieve.index.cache import encode_cached


@dataclass
class Split:
    """Queries with at least one relevant document, in a fixed order."""

    corpus: list[Document]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, int]]

    @property
    def doc_row(self) -> dict[str, int]:
        return {doc.id: row for row, doc in enumerate(self.corpus)}

    def positives(self, i: int) -> list[int]:
        """Corpus rows judged relevant for query i (ids missing from the corpus are skipped)."""
        rows = self.doc_row
        return [rows[d] for d, grade in self.qrels[self.query_ids[i]].items() if grade > 0 and d in rows]

    def subset(self, picks: list[int]) -> "Split":
        return Split(self.corpus, [self.query_ids[i] for i in picks], [self.query_texts[i] for i in picks], self.qrels)


def load_split(data_dir: str | Path, split: str, corpus: list[Document] | None = None) -> Split:
    data_dir = Path(data_dir)
    qrels_path = data_dir / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        available = sorted(p.stem for p in (data_dir / "qrels").glob("*.tsv"))
        raise FileNotFoundError(f"no split {split!r} in {data_dir}; available: {available}")
    corpus = corpus if corpus is not None else read_beir_corpus(data_dir / "corpus.jsonl")
    qrels = read_qrels(qrels_path)
    queries = read_queries(data_dir / "queries.jsonl")
    ids = [q for q in qrels if q in queries and any(g > 0 for g in qrels[q].values())]
    return Split(corpus, ids, [queries[q] for q in ids], qrels)


def hold_out(split: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """(train, dev) by a seeded shuffle of the queries: SciFact has no dev split, so part of train is held out."""
    order = np.random.default_rng(seed).permutation(len(split.query_ids)).tolist()
    n_dev = max(1, int(round(len(order) * fraction)))
    return split.subset(sorted(order[n_dev:])), split.subset(sorted(order[:n_dev]))


def corpus_vectors(split: Split, encoder, cache_dir: Path | None, progress: bool = True) -> np.ndarray:
    """(N, d) float32 bi-encoder document vectors, cached by model and corpus hash (the same cache as the index)."""
    return encode_cached(encoder, [doc.full_text for doc in split.corpus], cache_dir, progress)
