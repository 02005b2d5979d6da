"""Training lists from the logs: each answer that got clicks becomes the candidate list CMC ranked (the first
SIEVE_FEEDBACK_LOG_CANDIDATES first-stage candidates, with the evidence they had) and a target weight per candidate:
a clicked document weighs 1 / p(rank it was shown at) (inverse propensity, clipped), or, policy-aware (the click
memory's selection), 1 / its exposure over its query's answers (`Logs.exposure`); an explicit label weighs label / 3.
An answer served from the result cache is joined, by its query's hash, to the latest full impression of that query.
The same lists, with qrels instead of clicks, are the learner's full-information ceiling (benchmarks/feedback_sim.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from sieve.feedback.log import read_records
from sieve.feedback.memory import Shown
from sieve.feedback.propensity import Propensities
from sieve.feedback.records import unpack
from sieve.pipeline.evidence import FEATURES, features

CLIP = 100.0  # largest inverse-propensity weight (variance): a click on a document shown in 1 answer of 20 at rank 6
# counts 100 under policy-aware weights, not 120; a click in a top 10 under 1/rank never reaches it


@dataclass
class Entry:
    """One list before it meets the index: ids in first-stage order, their raw evidence, target weight by id."""
    key: str  # the query's hash: held-out splits go by query, never by answer
    vector: np.ndarray  # (d,)
    ids: list[str]
    be: np.ndarray
    bm25: np.ndarray
    targets: dict[str, float]
    ranks: dict[str, int] = field(default_factory=dict)  # clicked id -> 1-based rank shown (the guard's IPS)
    t: float = 0.0  # when the answer was given (unix time): time splits


@dataclass
class ClickLists:
    query_vectors: np.ndarray  # (Q, d) float32
    rows: np.ndarray  # (Q, K) int64 index rows, -1 padded
    features: np.ndarray  # (Q, K, F) float32
    targets: np.ndarray  # (Q, K) float32
    keys: list[str]

    def __len__(self) -> int:
        return len(self.keys)

    def select(self, picks) -> "ClickLists":
        picks = np.asarray(picks, dtype=np.int64)
        return ClickLists(self.query_vectors[picks], self.rows[picks], self.features[picks], self.targets[picks],
                          [self.keys[i] for i in picks])


def build(entries: list[Entry], index, depth: int) -> tuple[ClickLists, dict]:
    """Lists over the documents still in the index (a deleted one is left out); a list none of whose targets is
    among its candidates is dropped (counted)."""
    d = len(entries[0].vector) if entries else 0
    vecs, rows, feats, targets, keys = [], [], [], [], []
    stats = {"lists": 0, "targets_not_in_candidates": 0, "documents_gone": 0}
    for e in entries:
        present = [i for i, doc in enumerate(e.ids[:depth]) if index.has_id(doc)]
        stats["documents_gone"] += min(len(e.ids), depth) - len(present)
        ids = [e.ids[i] for i in present]
        where = {doc: i for i, doc in enumerate(ids)}
        stats["targets_not_in_candidates"] += sum(1 for doc in e.targets if doc not in where)
        t = np.zeros(depth, np.float32)
        for doc, w in e.targets.items():
            if doc in where:
                t[where[doc]] = w
        if not t.any():
            continue
        r = np.full(depth, -1, np.int64)
        r[:len(ids)] = index.rows_for_ids(ids)
        f = np.zeros((depth, len(FEATURES)), np.float32)
        f[:len(ids)] = features(e.be[present], e.bm25[present])
        vecs.append(e.vector), rows.append(r), feats.append(f), targets.append(t), keys.append(e.key)
    stats["lists"] = len(keys)
    if not keys:
        return ClickLists(np.zeros((0, d), np.float32), np.zeros((0, depth), np.int64),
                          np.zeros((0, depth, len(FEATURES)), np.float32), np.zeros((0, depth), np.float32), []), stats
    return ClickLists(np.stack(vecs).astype(np.float32), np.stack(rows), np.stack(feats), np.stack(targets), keys), stats


def click_weight(props: Propensities, clip: float, exposure: dict[str, tuple[int, dict[str, float]]]):
    """The weight of a click on `doc` shown at `rank` for query `key`, as a function of (key, doc, rank): 1 / the
    document's policy-aware propensity over its query's answers (`exposure`, Logs.exposure), or 1 / p(rank) where
    `exposure` has no examinations for it (position weights: an empty `exposure`), clipped at `clip`."""
    def weight(key: str, doc: str, rank: int) -> float:
        n, exams = exposure.get(key, (0, {}))
        rho = exams[doc] / n if n and exams.get(doc) else props.of(rank)
        return min(1.0 / rho, clip)
    return weight


@dataclass
class Logs:
    impressions: dict[str, dict]
    events: list[dict]

    @classmethod
    def read(cls, root: Path) -> "Logs":
        return cls({r["request_id"]: r for r in read_records(root, "impressions")}, list(read_records(root, "events")))

    def clicks(self) -> dict[str, list[dict]]:
        """request id -> its events, for impressions still in the log (retention may have dropped the rest)."""
        out: dict[str, list[dict]] = {}
        for e in self.events:
            if e["request_id"] in self.impressions:
                out.setdefault(e["request_id"], []).append(e)
        return out

    def for_propensity(self) -> Iterable[tuple[int, int | None, list[int]]]:
        """(results shown, swap, clicked 1-based ranks) of every /search answer, clicked or not, but those that
        explored (deeper candidates shown: the click rates per rank are not the served ranking's there)."""
        clicks = self.clicks()
        for rid, imp in self.impressions.items():
            if imp.get("endpoint") != "/search" or imp.get("explore"):
                continue
            shown = imp["shown"]
            ranks = sorted({shown.index(e["doc_id"]) + 1 for e in clicks.get(rid, ())
                            if e.get("type", "click") == "click" and e["doc_id"] in shown})
            yield len(shown), imp.get("swap"), ranks

    def answers(self) -> list[Shown]:
        """Every /search answer (clicked or not) as the click memory counts it, oldest first."""
        clicks = self.clicks()
        out = []
        for rid, imp in self.impressions.items():
            if imp.get("endpoint") != "/search":
                continue
            clicked = {e["doc_id"] for e in clicks.get(rid, ()) if e.get("type", "click") == "click"}
            out.append(Shown(imp["query_key"], list(imp["shown"]), clicked & set(imp["shown"]), imp["t"]))
        return sorted(out, key=lambda a: a.t)

    def exposure(self, props: Propensities) -> dict[str, tuple[int, dict[str, float]]]:
        """Query key -> (its /search answers, doc id -> the examinations those answers gave it: the sum of p(rank)
        over the answers that showed it). exams / answers is the document's policy-aware propensity for that query
        (Oosterhuis & de Rijke, "Policy-aware unbiased learning to rank", WSDM 2020): the chance an answer of the
        logging policy, which explores, showed it where it was examined."""
        out: dict[str, tuple[int, dict[str, float]]] = {}
        for imp in self.impressions.values():
            if imp.get("endpoint") != "/search":
                continue
            n, exams = out.get(imp["query_key"], (0, {}))
            for rank, doc in enumerate(imp["shown"], 1):
                exams[doc] = exams.get(doc, 0.0) + props.of(rank)
            out[imp["query_key"]] = (n + 1, exams)
        return out

    def entries(self, props: Propensities, clip: float = CLIP, propensities: str = "position",
                exposure: dict[str, tuple[int, dict[str, float]]] | None = None) -> tuple[list[Entry], dict]:
        """One entry per clicked or labelled answer that has (or joins) a full impression, oldest answer first.
        propensities `position`: a click weighs 1 / p(the rank it was shown at); `policy`: 1 / (the examinations
        its document got over its query's answers / those answers), so a document the logging policy showed in few
        of its query's answers (exploration) weighs what it would have weighed shown in all of them (exposure).
        `exposure`: `self.exposure(props)` when the caller has it already."""
        if propensities != "policy":
            exposure = {}
        elif exposure is None:
            exposure = self.exposure(props)
        weight = click_weight(props, clip, exposure)
        latest = {}
        for imp in sorted(self.impressions.values(), key=lambda r: r["t"]):
            if "candidates" in imp and "vector" in imp:
                latest[imp["query_key"]] = imp
        entries, unjoined = [], 0
        for rid, events in sorted(self.clicks().items(), key=lambda item: self.impressions[item[0]]["t"]):
            imp = self.impressions[rid]
            full = imp if "candidates" in imp and "vector" in imp else latest.get(imp["query_key"])
            if full is None:
                unjoined += 1
                continue
            targets, ranks = {}, {}
            for e in events:
                if e.get("type") == "label":
                    targets[e["doc_id"]] = max(targets.get(e["doc_id"], 0.0), e["label"] / 3)
                elif e["doc_id"] in imp["shown"]:
                    rank = imp["shown"].index(e["doc_id"]) + 1
                    w = weight(imp["query_key"], e["doc_id"], rank)
                    targets[e["doc_id"]] = max(targets.get(e["doc_id"], 0.0), w)
                    ranks[e["doc_id"]] = rank
            entries.append(Entry(imp["query_key"], unpack(full["vector"]), full["candidates"], unpack(full["be"]),
                                 unpack(full["bm25"]), targets, ranks, imp["t"]))
        return entries, {"answers_with_events": len(entries) + unjoined, "without_candidates": unjoined}
