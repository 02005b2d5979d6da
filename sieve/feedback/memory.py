"""The click memory: what users clicked, remembered per (query, document) and per document, and added to /search
scores (the click-through features of production learning to rank from clicks: Metarank, the LTR plugins).

Counts (`tally`), from the impressions and click events the server logged: for every /search answer, each document
shown at rank r was examined with probability p(r) (propensity.py), so it collects p(r) expected examinations; a
click collects 1 (a document clicked twice in one answer counts once). Per (query hash, document) and per document
over all queries:
    COEC = clicks / expected examinations            (clicks over expected clicks: position bias removed)
    smoothed = (clicks + m x prior) / (examinations + m),  prior = all clicks / all examinations
    f = log(smoothed / prior), clipped to [-F_CLIP, F_CLIP]
so f > 0 for a document clicked more than the average document at its ranks, f < 0 for one examined often and
clicked rarely, and f ~ 0 where the evidence is thin (m pseudo-examinations at the prior). Only pairs and documents
with evidence are kept.

At /search (`rerank`), after the last ranking stage scored all the candidates and before the top_k cut:
    score' = score + w_q x f(query, document) + w_d x f(document)
         (+ w_n x f(nearest other remembered queries, document): the cosine-weighted mean of f over the near_k
            remembered queries closest to this one by query vector, those with cosine >= near_min)
With `doc_gate` the per-document term speaks only for a query the memory knows: remembered itself, or with a
remembered query at cosine >= doc_gate (a query about a topic no user clicked on gets no popularity boost). With
`doc_related` it speaks for a document only where a remembered query whose users clicked it (f(that query, document)
> 0) is at cosine >= doc_related with this query: a document popular with users of other topics is not lifted for
this one (RESULTS.md, issue 33, twenty-fifth session: on SciFact that popularity cost the queries without a train
query about their documents -0.02).
where `score` is the answer's own `score` (never increasing down the list), and the list is sorted by score' again
(stable): a clicked document deeper in the candidates can rise, one examined often and never clicked can fall.
The query is found by the hash the impression recorder logs (records.query_key of the whitespace-normalised query).
`w_q`, `w_d` and `m` are chosen by `sieve feedback learn` (training/memory_learn.py); the memory is published into
the index directory (memory_store.py) and picked up live (service/memory_serving.py).
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from sieve.feedback.records import pack, query_key, unpack

F_CLIP = 3.0
SCORE_KEY = "clicks"  # the candidates' score column the memory writes (pipeline/registry.py knows it)
FILE = "memory.json"
MAX_NEAR = 50_000  # remembered queries whose vectors the nearest-query term searches (one matrix product each)


@dataclass
class Shown:
    """One logged /search answer as the memory reads it."""
    key: str
    shown: list[str]
    clicked: set[str]
    t: float = 0.0


@dataclass
class Tallies:
    """Clicks and expected examinations per (query key, doc id) and per doc id."""
    pairs: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    docs: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    answers: int = 0

    def add(self, answer: Shown, props) -> None:
        self.answers += 1
        for rank, doc in enumerate(answer.shown, 1):
            p = props.of(rank)
            c = 1.0 if doc in answer.clicked else 0.0
            for cell in (self.pairs[(answer.key, doc)], self.docs[doc]):
                cell[0] += c
                cell[1] += p

    @property
    def prior(self) -> float:
        clicks = sum(c for c, _ in self.docs.values())
        exams = sum(e for _, e in self.docs.values())
        return clicks / exams if exams > 0 and clicks > 0 else 0.0


def tally(answers: Iterable[Shown], props) -> Tallies:
    out = Tallies()
    for answer in answers:
        out.add(answer, props)
    return out


def log_ratio(clicks: float, exams: float, prior: float, m: float) -> float:
    smoothed = (clicks + m * prior) / (exams + m)
    return min(max(math.log(max(smoothed, 1e-9) / prior), -F_CLIP), F_CLIP)  # np.clip's value, 10x faster on a float


@dataclass
class ClickMemory:
    """f per (query key, doc id) and per doc id, and the weights that add them to scores."""
    w_query: float
    w_doc: float
    pseudo: float
    prior: float
    pairs: dict[str, dict[str, float]]  # query key -> doc id -> f
    docs: dict[str, float]  # doc id -> f
    w_near: float = 0.0  # weight of the nearest other remembered queries' f (by query vector), when cos >= near_min
    near_min: float = 0.9
    near_k: int = 1  # how many of the nearest remembered queries (cos >= near_min) the term averages
    near_keys: list[str] = field(default_factory=list)  # queries whose vectors are kept (rows of near_vectors)
    near_vectors: np.ndarray | None = None  # (N, d) float32, unit length
    doc_gate: float | None = None  # w_d f(document) only for a known query: remembered, or one at this cosine
    doc_related: float | None = None  # w_d f(document) only where a remembered query that clicked it is this close
    _clickers: tuple | None = field(default=None, init=False, repr=False, compare=False)  # doc_table(), once built
    version: str = ""  # the published directory's name (the results-cache fingerprint reads it)
    about: dict = field(default_factory=dict)

    @classmethod
    def build(cls, tallies: Tallies, w_query: float, w_doc: float, pseudo: float, about: dict | None = None,
              w_near: float = 0.0, near_min: float = 0.9, vectors: dict[str, np.ndarray] | None = None,
              near_k: int = 1, doc_gate: float | None = None, doc_related: float | None = None):
        """`vectors`: query key -> the query's vector (the impressions'), for the nearest-query term and the gate of
        the per-document term and its clicker gate (doc_related)."""
        gated = w_doc and (doc_gate is not None or doc_related is not None)  # the term reads the queries' vectors
        prior = tallies.prior
        pairs: dict[str, dict[str, float]] = {}
        docs: dict[str, float] = {}
        if prior > 0:
            if w_query or w_near or gated:
                for (key, doc), (c, e) in tallies.pairs.items():
                    pairs.setdefault(key, {})[doc] = log_ratio(c, e, prior, pseudo)
            if w_doc:
                docs = {doc: log_ratio(c, e, prior, pseudo) for doc, (c, e) in tallies.docs.items()}
        keys, matrix = [], None
        if (w_near or gated) and vectors:
            keys = [k for k in pairs if k in vectors][:MAX_NEAR]
            if keys:
                matrix = np.stack([vectors[k] for k in keys]).astype(np.float32)
                matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        return cls(w_query, w_doc, pseudo, prior, pairs, docs, w_near if keys else 0.0, near_min, near_k, keys,
                   matrix, doc_gate=doc_gate if w_doc else None, doc_related=doc_related if w_doc and keys else None,
                   about=dict(about or {}))

    def similarities(self, vector) -> np.ndarray | None:
        """Cosine of `vector` with every remembered query's vector (None: no vector or none remembered)."""
        if vector is None or self.near_vectors is None:
            return None
        v = np.asarray(vector, np.float32).reshape(-1)
        return self.near_vectors @ (v / max(float(np.linalg.norm(v)), 1e-12))

    def knows(self, key: str, sims: np.ndarray | None, gate: float | None = None) -> bool:
        """Whether the query is remembered itself or has a remembered query at cosine >= `gate` (default doc_gate;
        none: every query is known)."""
        gate = self.doc_gate if gate is None else gate
        if gate is None or key in self.pairs:
            return True
        return sims is not None and bool((sims >= gate).any())

    def doc_table(self) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
        """The per-document term as arrays, built once: (doc id -> slot, f by slot with a 0 after the last (the slot
        -1 of a document without one), starts (slots + 1,), rows): slot j's clickers are rows[starts[j]:starts[j + 1]]
        of near_vectors, the remembered queries whose users clicked it (f(query, document) > 0; maybe none)."""
        if self._clickers is None:
            slot = {doc: j for j, doc in enumerate(self.docs)}
            by_slot: list[list[int]] = [[] for _ in slot]
            for row, key in enumerate(self.near_keys):
                for doc, f in self.pairs.get(key, {}).items():
                    if f > 0 and doc in slot:
                        by_slot[slot[doc]].append(row)
            starts = np.cumsum([0] + [len(v) for v in by_slot]).astype(np.int64)
            rows = np.fromiter((r for v in by_slot for r in v), np.int64, int(starts[-1]))
            f = np.fromiter(self.docs.values(), np.float64, len(slot))
            self._clickers = (slot, np.append(f, 0.0), starts, rows)
        return self._clickers

    def slots(self, ids) -> np.ndarray:
        """(len(ids),) each document's slot in doc_table(), -1 for one without a per-document term."""
        slot = self.doc_table()[0]
        return np.fromiter((slot.get(d, -1) for d in ids), np.int64, len(ids))

    def closest_by_slot(self, at: np.ndarray, sims: np.ndarray) -> np.ndarray:
        """closest_clicker() from slots(ids)."""
        _, _, starts, rows = self.doc_table()
        best = np.full(len(starts), -np.inf)  # the last: slot -1
        some = np.flatnonzero(starts[:-1] < starts[1:])
        if len(some):
            best[some] = np.maximum.reduceat(sims[rows], starts[some])  # clickers of a slot are contiguous
        return best[at]

    def closest_clicker(self, ids, sims: np.ndarray) -> np.ndarray:
        """(len(ids),) per document the cosine of this query (`sims`: its similarities()) with the closest remembered
        query whose users clicked it, -inf where none did (the sign of f, so this, does not depend on m)."""
        return self.closest_by_slot(self.slots(ids), sims)

    def related(self, at: np.ndarray, sims: np.ndarray | None) -> np.ndarray:
        """(len(at),) True where the per-document term speaks for the document in slot `at` (slots(ids); doc_related:
        a remembered query that clicked it is at cosine >= doc_related); all True without that gate, all False
        without a vector."""
        if self.doc_related is None:
            return np.ones(len(at), bool)
        if sims is None:
            return np.zeros(len(at), bool)
        return self.closest_by_slot(at, sims) >= self.doc_related

    def nearest(self, key: str, vector, sims: np.ndarray | None = None) -> dict[str, float]:
        """f of the nearest other remembered queries (up to near_k with cos >= near_min; more than one: their
        cosine-weighted mean, a document one of them has no evidence for counting 0 there), {} when there is none.
        `sims`: `self.similarities(vector)` when the caller has it already."""
        if not self.w_near:
            return {}
        if sims is None:
            sims = self.similarities(vector)
        if sims is None:
            return {}
        n = min(len(sims), self.near_k + 1)  # itself, when remembered, is among them
        top = np.argpartition(-sims, n - 1)[:n] if len(sims) > n else np.arange(len(sims))
        near = [(self.near_keys[j], float(sims[j])) for j in top[np.argsort(-sims[top], kind="stable")]
                if sims[j] >= self.near_min and self.near_keys[j] != key][:self.near_k]
        if len(near) <= 1:
            return self.pairs[near[0][0]] if near else {}
        total, mean = sum(sim for _, sim in near), defaultdict(float)
        for other, sim in near:
            for doc, f in self.pairs[other].items():
                mean[doc] += sim / total * f
        return mean

    def __len__(self) -> int:
        return sum(len(v) for v in self.pairs.values()) + len(self.docs)

    def boost(self, key: str, ids, vector=None) -> np.ndarray:
        """w_q f(key, id) + w_n f(nearest query, id) + w_d f(id) for each id (0 without evidence). The per-query
        tables are small (the documents a query's users saw): they are walked and placed by position; the
        per-document table is looked up once per id; one product with the remembered queries' vectors when the
        nearest-query term is on."""
        out = np.zeros(len(ids))
        sims = self.similarities(vector) if self.w_near or self.doc_gate is not None or self.doc_related is not None \
            else None
        if self.w_doc and self.docs and self.knows(key, sims):
            at = self.slots(ids)
            fd = self.doc_table()[1][at]
            out += self.w_doc * (fd if self.doc_related is None else fd * self.related(at, sims))
        tables = [(t, w) for t, w in ((self.pairs.get(key) if self.w_query else None, self.w_query),
                                       (self.nearest(key, vector, sims), self.w_near)) if t]
        if tables:
            at = {doc: i for i, doc in enumerate(ids)}
            for table, weight in tables:
                for doc, f in table.items():
                    i = at.get(doc)
                    if i is not None:
                        out[i] += weight * f
        return out

    @staticmethod
    def key_of(query: str) -> str:
        """The hash the impression recorder logs for this query (recorder.to_record)."""
        return query_key(" ".join(query.split()))

    # -- on disk ------------------------------------------------------------------------------------------------
    def save(self, directory: Path) -> Path:
        path = Path(directory) / FILE
        vectors = {} if self.near_vectors is None else {k: pack(v) for k, v in zip(self.near_keys, self.near_vectors)}
        path.write_text(json.dumps({"w_query": self.w_query, "w_doc": self.w_doc, "pseudo": self.pseudo,
                                    "prior": self.prior, "w_near": self.w_near, "near_min": self.near_min,
                                    "near_k": self.near_k, "doc_gate": self.doc_gate, "doc_related": self.doc_related,
                                    "pairs": self.pairs, "docs": self.docs, "vectors": vectors,
                                    "about": self.about}, separators=(",", ":")), encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: Path) -> "ClickMemory":
        raw = json.loads((Path(directory) / FILE).read_text(encoding="utf-8"))
        vectors = raw.get("vectors") or {}
        keys = list(vectors)
        matrix = np.stack([unpack(vectors[k]) for k in keys]) if keys else None
        memory = cls(float(raw["w_query"]), float(raw["w_doc"]), float(raw["pseudo"]), float(raw["prior"]),
                   {k: {d: float(f) for d, f in v.items()} for k, v in raw["pairs"].items()},
                   {d: float(f) for d, f in raw["docs"].items()}, float(raw.get("w_near", 0.0)),
                   float(raw.get("near_min", 0.9)), int(raw.get("near_k", 1)), keys, matrix,
                   raw.get("doc_gate"), raw.get("doc_related"), Path(directory).name, raw.get("about", {}))
        memory.doc_table()  # built here, where the server loads a memory off the request path, not by a /search
        return memory
