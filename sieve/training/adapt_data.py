"""The training lists of `sieve adapt`: pseudo-queries of an index's documents, each with the candidates the served
hybrid first stage gives it (the Searcher's own stage, `retrieve_k` deep), their evidence features and where the
source document stands among them. Reads the index only: its documents, vectors and BM25 part, through the index
contract (index/protocol.py), so a local index and a Qdrant collection are read alike (`Corpus`).

Lists are mined in chunks written to the work directory (safetensors + JSON, atomically), so an interrupted
`sieve adapt` resumes where it stopped.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from tqdm.auto import tqdm

from sieve.index.corpus import Document
from sieve.pipeline.evidence import FEATURES, features
from sieve.pipeline.searcher import Searcher, SearchParams
from sieve.training.pseudo_queries import PseudoQuery

CHUNK = 512  # pseudo-queries mined per saved chunk


@dataclass
class Corpus:
    """An index's documents as `sieve adapt` reads them, in a fixed order (position i: documents, vectors; the
    lists below hold positions): each with its handle in the index (a live row, a Qdrant point id)."""
    handles: np.ndarray  # (N,) int64
    docs: list[Document]
    vectors: np.ndarray  # (N, d) float32 bi-encoder vectors

    def __post_init__(self):
        self.order = np.argsort(self.handles, kind="stable")
        self.sorted = self.handles[self.order]

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.docs]

    def positions(self, handles: np.ndarray) -> np.ndarray:
        """Positions of index handles (-1: not in this corpus, e.g. a document written after it was read)."""
        handles = np.asarray(handles, np.int64)
        if not len(self.sorted):
            return np.full(len(handles), -1, np.int32)
        at = np.searchsorted(self.sorted, handles).clip(max=len(self.sorted) - 1)
        return np.where(self.sorted[at] == handles, self.order[at], -1).astype(np.int32)


def read_corpus(index) -> Corpus:
    """Every document of the index: a Qdrant collection page by page, a local index by live row."""
    if hasattr(index, "every_point"):
        return Corpus(*index.every_point())
    rows = np.arange(index.size)
    return Corpus(rows.astype(np.int64), index.documents(rows), index.embeddings(rows))


@dataclass
class Lists:
    """Candidate lists of pseudo-queries: row i's candidates are rows[i, :lengths[i]] (index rows, first-stage
    order), the source document at positive[i] (-1: not among them)."""
    query_vectors: np.ndarray  # (Q, d) float32
    rows: np.ndarray  # (Q, K) int32, -1 padded
    features: np.ndarray  # (Q, K, F) float32
    lengths: np.ndarray  # (Q,) int32
    positive: np.ndarray  # (Q,) int32
    sources: np.ndarray  # (Q,) int32 index row of the source document
    source_vectors: np.ndarray  # (Q, d) float32: the source as training sees it (ict: without the query sentence)

    def __len__(self) -> int:
        return len(self.lengths)

    def select(self, picks: np.ndarray) -> "Lists":
        return Lists(*(getattr(self, f)[picks] for f in self.__dataclass_fields__))

    @staticmethod
    def concat(parts: Sequence["Lists"], k: int, d: int) -> "Lists":
        if not parts:
            return Lists(np.zeros((0, d), np.float32), np.zeros((0, k), np.int32),
                     np.zeros((0, k, len(FEATURES)), np.float32), *(np.zeros(0, np.int32) for _ in range(3)),
                     np.zeros((0, d), np.float32))
        return Lists(*(np.concatenate([getattr(p, f) for p in parts]) for f in Lists.__dataclass_fields__))


class _Vectors:
    """An embedding cache holding precomputed query vectors (batch-encoded), so the Searcher skips its model."""

    def __init__(self, vectors: dict[str, torch.Tensor]):
        self.vectors = vectors

    def get(self, tower, query: str):
        return self.vectors.get(query)

    def put(self, tower, query: str, vector) -> None:
        pass


def refuse(be: np.ndarray, bm25: np.ndarray, hybrid) -> np.ndarray:
    """The order reciprocal-rank fusion gives a list from its own scores (ranks within the list; BM25 counts only
    where positive, as the BM25 list holds only documents sharing a term)."""
    def ranks(values):
        out = np.empty(len(values))
        out[np.argsort(-values, kind="stable")] = np.arange(1, len(values) + 1)
        return out

    fused = hybrid.weight_be / (hybrid.rrf_k + ranks(be)) + (bm25 > 0) * hybrid.weight_bm25 / (hybrid.rrf_k + ranks(bm25))
    return np.argsort(-fused, kind="stable")


def mine_chunk(searcher: Searcher, corpus: Corpus, queries: Sequence[PseudoQuery], k: int, stats=None) -> Lists:
    """The served hybrid candidates of each pseudo-query (as corpus positions), with evidence features as CMC sees
    them. A pseudo-query with a `rest` sees its source as that text: the source's vector, bi-encoder and BM25 scores
    are recomputed from it and the list re-fused, so the query is no quote of its positive."""
    texts = [searcher.normalise(q.text) for q in queries]
    encoded = searcher.biencoder.encode_queries(texts).float().cpu()  # (n, d)
    searcher.embedding_cache = _Vectors(dict(zip(texts, encoded)))
    n, d = len(queries), encoded.shape[1]
    sources = np.array([q.source for q in queries], np.int32)
    out = Lists(encoded.numpy().astype(np.float32), np.full((n, k), -1, np.int32),
                np.zeros((n, k, len(FEATURES)), np.float32), np.zeros(n, np.int32), np.full(n, -1, np.int32),
                sources, corpus.vectors[sources].copy())
    masked = [i for i, q in enumerate(queries) if q.rest is not None]
    if masked:
        out.source_vectors[masked] = searcher.biencoder.encode_documents([queries[i].rest for i in masked],
                                                                         progress=False)
    for i, text in enumerate(texts):
        outcome = searcher.search(SearchParams(text, top_k=1, retrieve_k=k, rerank="none", retriever="hybrid", cmc_k=1))
        cands = outcome.state.candidates
        rows, be, bm25 = corpus.positions(cands.rows), cands.scores["be"].copy(), cands.scores["bm25"].copy()
        hit = np.flatnonzero(rows == queries[i].source)
        if len(hit) and queries[i].rest is not None:
            be[hit[0]] = out.source_vectors[i] @ out.query_vectors[i]
            bm25[hit[0]] = stats.bm25(text, queries[i].rest)
            order = refuse(be, bm25, searcher.options.hybrid)
            rows, be, bm25 = rows[order], be[order], bm25[order]
            hit = np.flatnonzero(rows == queries[i].source)
        m = len(rows)
        out.rows[i, :m] = rows
        out.features[i, :m] = features(be, bm25)
        out.lengths[i] = m
        out.positive[i] = hit[0] if len(hit) else -1
    searcher.embedding_cache = None
    return out


def _atomic_save(arrays: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    save_file(arrays, str(tmp))
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def mine(searcher: Searcher, corpus: Corpus, queries: Sequence[PseudoQuery], k: int, work: Path,
         deadline: float | None = None, progress: bool = True, stats=None) -> Lists:
    """All chunks (those already in `work` are read back); stops early at `deadline` (time.monotonic())."""
    work.mkdir(parents=True, exist_ok=True)
    parts = []
    chunks = range(0, len(queries), CHUNK)
    bar = tqdm(total=len(queries), desc="mine candidates", unit="query", disable=not progress)
    for number, start in enumerate(chunks):
        path = work / f"mined-{number:05d}.safetensors"
        if path.is_file():
            parts.append(Lists(**load_file(str(path))))
        else:
            if deadline is not None and time.monotonic() > deadline:
                bar.write(f"time budget reached while mining: {sum(len(p) for p in parts)} pseudo-queries mined")
                break
            part = mine_chunk(searcher, corpus, queries[start:start + CHUNK], k, stats)
            _atomic_save({f: getattr(part, f) for f in Lists.__dataclass_fields__}, path)
            parts.append(part)
        bar.update(len(parts[-1]))
    bar.close()
    return Lists.concat(parts, k, searcher.biencoder.dim)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
