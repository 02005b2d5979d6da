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

from sieve.feedback.records import query_key

F_CLIP = 3.0
SCORE_KEY = "clicks"  # the candidates' score column the memory writes (pipeline/registry.py knows it)
FILE = "memory.json"


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
    return float(np.clip(math.log(max(smoothed, 1e-9) / prior), -F_CLIP, F_CLIP))


@dataclass
class ClickMemory:
    """f per (query key, doc id) and per doc id, and the weights that add them to scores."""
    w_query: float
    w_doc: float
    pseudo: float
    prior: float
    pairs: dict[str, dict[str, float]]  # query key -> doc id -> f
    docs: dict[str, float]  # doc id -> f
    version: str = ""  # the published directory's name (the results-cache fingerprint reads it)
    about: dict = field(default_factory=dict)

    @classmethod
    def build(cls, tallies: Tallies, w_query: float, w_doc: float, pseudo: float, about: dict | None = None):
        prior = tallies.prior
        pairs: dict[str, dict[str, float]] = {}
        docs: dict[str, float] = {}
        if prior > 0:
            if w_query:
                for (key, doc), (c, e) in tallies.pairs.items():
                    pairs.setdefault(key, {})[doc] = log_ratio(c, e, prior, pseudo)
            if w_doc:
                docs = {doc: log_ratio(c, e, prior, pseudo) for doc, (c, e) in tallies.docs.items()}
        return cls(w_query, w_doc, pseudo, prior, pairs, docs, about=dict(about or {}))

    def __len__(self) -> int:
        return sum(len(v) for v in self.pairs.values()) + len(self.docs)

    def boost(self, key: str, ids) -> np.ndarray:
        """w_q f(key, id) + w_d f(id) for each id (0 without evidence): dict look-ups only."""
        pair, docs, wq, wd = self.pairs.get(key), self.docs, self.w_query, self.w_doc
        if pair is None and not docs:
            return np.zeros(len(ids))
        if pair is None:
            return wd * np.array([docs.get(doc, 0.0) for doc in ids])
        return np.array([wq * pair.get(doc, 0.0) + wd * docs.get(doc, 0.0) for doc in ids])

    @staticmethod
    def key_of(query: str) -> str:
        """The hash the impression recorder logs for this query (recorder.to_record)."""
        return query_key(" ".join(query.split()))

    # -- on disk ------------------------------------------------------------------------------------------------
    def save(self, directory: Path) -> Path:
        path = Path(directory) / FILE
        path.write_text(json.dumps({"w_query": self.w_query, "w_doc": self.w_doc, "pseudo": self.pseudo,
                                    "prior": self.prior, "pairs": self.pairs, "docs": self.docs,
                                    "about": self.about}, separators=(",", ":")), encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: Path) -> "ClickMemory":
        raw = json.loads((Path(directory) / FILE).read_text(encoding="utf-8"))
        return cls(float(raw["w_query"]), float(raw["w_doc"]), float(raw["pseudo"]), float(raw["prior"]),
                   {k: {d: float(f) for d, f in v.items()} for k, v in raw["pairs"].items()},
                   {d: float(f) for d, f in raw["docs"].items()}, Path(directory).name, raw.get("about", {}))
