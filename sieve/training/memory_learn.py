"""`sieve feedback learn`'s click memory (sieve/feedback/memory.py): counted from the logs, weighed on validation,
judged on held-out answers, published into the index.

The logged /search answers are split three ways, as the CMC learner splits them (`--split`): by query (a stable
hash of the query key: a query is on one side in every run) or by time (the latest answers held out, the latest of
the rest validate). The memory counted from the fit answers is added to the served CMC's scores of each clicked
answer's logged candidates (replacing the memory served now, if any) with every (w_q, w_n, w_d, m, near_min, near_k)
of the grid (w_n: the term of the nearest other remembered queries by the logged query vectors, averaged over up to
near_k of them); the one with the best mean IPS-DCG on the validation answers (a click weighted by
`cfg.propensities`: policy-aware by default, 1 / its document's exposure over its query's answers, so what
exploration showed in few answers is not counted as a loss when promoted) is kept if it beats the ranking without a
memory (ties: the smaller weights; all 0 = nothing to publish). With `cfg.support` "shown" the estimate ranks each
answer's candidates only among those some logged answer of its query showed (`Scored.judged`): a document none
showed could not have been clicked, so a memory that promotes it is neither charged nor credited for it; the
default "all" charges it, which favours small weights (RESULTS.md, twenty-first session: "shown" gained on the
queries that have train queries about their documents and cost the others); the guard likewise with
`cfg.guard_support`, or with "both" (the default) on the shown support, the memory refused all the same where the
estimate over every candidate, which charges each such promotion, puts it clearly below the served ranking (its
95% interval wholly under 0: `charged_below`; RESULTS.md, twenty-ninth and fortieth sessions). With `cfg.doc_gate`
the per-document term speaks only for a query the memory knows (remembered, or a remembered query at cosine >= doc_gate:
ClickMemory.doc_gate), which spares queries about topics no user clicked on (RESULTS.md, twenty-second session). With
`cfg.noise` "estimated" the selection's and the guard's estimates are affine-corrected for clicks on non-relevant
results (sieve/feedback/noise.py: the noise rate b fitted to the counted pairs; b x the credit noise alone would give
each document a judged query's answers showed is taken off it), so keeping a shown non-relevant document earns nothing
over promoting one no answer showed. With `cfg.estimate` "dr" (the default) the selection's estimate, and the guard's
over every candidate ("both"), are doubly robust (memory_dr.py): a promoted candidate no answer of its query showed is
credited with a direct-method estimate of its clicks per examination, fitted on the judged queries' shown candidates,
instead of only charged for what it pushes down.
Split by query, every answer that is not held out validates: the queries are cut into `memory_folds` folds, each judged
with the memory counted from the others (`selection_folds`). The memory counted from fit + validation answers with those
weights is then judged on the held-out answers (clicks weighted by `cfg.guard_propensities`, 1 / p(rank shown) by
default; feedback_learn.compare: the IPS-DCG difference with its 95% bootstrap interval, on at least `min_heldout`
answers; `memory_verdict`: the first memory must clearly beat the served ranking, as a CMC must; an update must clearly
beat the ranking without a memory and not be below the served memory) and published only then: with the held-out
guard the memory judged is the memory published. The cross-fitted guard (`crossfit`, the default up to
`crossfit_max_answers`) judges the procedure instead, every share of the queries with the memory it makes from the
others, and then publishes (`cfg.memory_publish` "refit", the default) the memory that procedure makes from every
answer (`refit`), which no held-out answer judged: cross-validation's refit, so the held-out share's clicks count too.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass, field, replace

import numpy as np
from tqdm.auto import tqdm

from sieve.feedback.dataset import ClickLists, Entry, build, click_weight
from sieve.feedback.memory import ClickMemory, Shown, Tallies, tally
from sieve.feedback.noise import Noise, estimate, expected_noise
from sieve.feedback.records import unpack
from sieve.training import memory_dr
from sieve.training.feedback_learn import compare, ips_dcg, target_ranks, verdict

W_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)  # x the served scores' spread (median std, top 10)
PSEUDO_GRID = (2.0, 10.0, 50.0, 200.0, 1000.0)
NEAR_GRID = (0.8, 0.9)  # cosine from which a near remembered query counts (0.7 dropped: RESULTS.md, twenty-second session)
NEAR_K_GRID = (1, 8)  # how many of the nearest remembered queries the term averages
# cosines the per-document term's clicker gate is tried at (and none): low, so it keeps documents that related queries
# clicked and drops the popularity other topics gave them (0.5 and 0.6 cost NFCorpus dev: RESULTS.md, twenty-fifth session)
DOC_RELATED_GRID = (0.2, 0.3, 0.4)


@functools.lru_cache(maxsize=1 << 18)
def bucket(key: str) -> float:
    """A query key's place in [0, 1): the same in every run, whatever other queries the logs hold (kept: the folds
    ask for every answer's query several times)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2 ** 32


def side(key: str, t: float, heldout_from: float | None, validation_from: float | None, cfg) -> str:
    if cfg.split == "time":
        return "heldout" if t >= heldout_from else "validation" if t >= validation_from else "fit"
    b = bucket(key)
    return "heldout" if b < cfg.heldout else "validation" if b < cfg.heldout + cfg.validation * (1 - cfg.heldout) \
        else "fit"


def time_cuts(answers: list[Shown], cfg) -> tuple[float | None, float | None]:
    """The answer times from which answers are held out / validate (split by time): shares of the answers with
    clicks (the ones either side can be judged on), an unclicked answer goes with the clicked ones around it."""
    if cfg.split != "time":
        return None, None
    times = sorted(a.t for a in answers if a.clicked)
    if not times:
        return float("inf"), float("inf")
    held = len(times) - int(round(cfg.heldout * len(times)))
    val = held - int(round(cfg.validation * held))
    return (times[held] if held < len(times) else float("inf")), times[max(val, 0)]


@dataclass
class Scored:
    """Clicked answers' candidate lists with the served CMC's scores, the served ranking's (the CMC's plus the memory
    served now, if any) and each candidate's memory terms. A new memory replaces the served one: it is added to
    `base`, never on top of the served memory."""
    lists: ClickLists
    base: np.ndarray  # (Q, K) the served CMC's scores (-inf on padding)
    ids: list[list[str | None]]
    served: np.ndarray | None = None  # (Q, K) what is served now; None = base (no memory served)
    shown: np.ndarray | None = None  # (Q, K) the candidates the estimate ranks (support "shown"); None = all
    _sims: tuple | None = field(default=None, repr=False)  # (remembered vectors, each list's similarities with them)

    def similarities(self, memory: ClickMemory) -> list[np.ndarray | None]:
        """memory.similarities() of each list's query vector, kept for the next memory with the same remembered
        vectors (select() judges tens of memories counted from one fold's answers)."""
        if self._sims is None or self._sims[0] is not memory.near_vectors:
            self._sims = (memory.near_vectors, [memory.similarities(v) for v in self.lists.query_vectors])
        return self._sims[1]

    def judged(self, scores: np.ndarray) -> np.ndarray:
        """`scores` as the click estimate ranks them: with a support, a candidate no logged answer of its query
        showed goes below every other (-inf), so promoting it neither costs nor earns."""
        return scores if self.shown is None else np.where(self.shown, scores, -np.inf)

    def terms(self, memory: ClickMemory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(f(query, doc), f(nearest other query, doc), f(doc)) per candidate, 0 without evidence."""
        fq, fn, fd = np.zeros(self.base.shape), np.zeros(self.base.shape), np.zeros(self.base.shape)
        every = self.similarities(memory) if memory.w_near or memory.doc_gate is not None \
            or memory.doc_related is not None else None
        for i, (key, ids) in enumerate(zip(self.lists.keys, self.ids)):
            pair = memory.pairs.get(key, {})
            sims = None if every is None else every[i]
            near = memory.nearest(key, self.lists.query_vectors[i], sims)
            docs = memory.docs if memory.knows(key, sims) else {}
            for j, doc in enumerate(ids):
                if doc is not None:
                    fq[i, j], fn[i, j], fd[i, j] = pair.get(doc, 0.0), near.get(doc, 0.0), docs.get(doc, 0.0)
            if memory.doc_related is not None:
                fd[i, :len(ids)] *= memory.related(memory.slots([doc or "" for doc in ids]), sims)
        return fq, fn, fd

    def closest(self, memory: ClickMemory) -> np.ndarray:
        """(Q, K) per candidate the cosine of its list's query with the closest remembered query that clicked it
        (ClickMemory.closest_clicker), -inf where none did or the list has no vector."""
        out = np.full(self.base.shape, -np.inf)
        for i, (ids, sims) in enumerate(zip(self.ids, self.similarities(memory))):
            if sims is not None:
                out[i, :len(ids)] = memory.closest_clicker([doc or "" for doc in ids], sims)
        return out

    def known(self, memory: ClickMemory, gate: float) -> np.ndarray:
        """(Q, 1) 1.0 where the memory knows the list's query at cosine `gate` (ClickMemory.knows), else 0.0."""
        return np.array([[float(memory.knows(key, memory.similarities(self.lists.query_vectors[i]), gate))]
                         for i, key in enumerate(self.lists.keys)]).reshape(-1, 1)

    def dcg(self, memory: ClickMemory | None = None) -> np.ndarray:
        """IPS-DCG per answer of the ranking with `memory` (None: the ranking served now)."""
        if memory is None:
            return ips_dcg(self.judged(self.base if self.served is None else self.served), self.lists)
        fq, fn, fd = self.terms(memory)
        return ips_dcg(self.judged(self.base + memory.w_query * fq + memory.w_near * fn + memory.w_doc * fd),
                       self.lists)

    def none(self) -> np.ndarray:
        """IPS-DCG per answer of the ranking without any memory."""
        return ips_dcg(self.judged(self.base), self.lists)


def support(keys: list[str], ids: list[list[str | None]], exposure: dict) -> np.ndarray:
    """(Q, K) True where a candidate was shown by some logged answer of its list's query (Logs.exposure)."""
    return np.array([[doc is not None and doc in exposure.get(key, (0, {}))[1] for doc in row]
                     for key, row in zip(keys, ids)], bool)


def scored(entries: list[Entry], index, depth: int, served_scores, served_memory: ClickMemory | None,
           exposure: dict | None = None) -> Scored:
    """`exposure` (Logs.exposure): the estimate ranks only the candidates some answer of their query showed."""
    lists, _ = build(entries, index, depth)
    base = served_scores(lists).astype(np.float64)
    ids = [[None if r < 0 else d for r, d in zip(rows, index.ids(np.clip(rows, 0, None)))] for rows in lists.rows]
    out = Scored(lists, base, ids)
    if exposure is not None:
        out.shown = support(lists.keys, ids, exposure).reshape(base.shape)
    if served_memory is not None:  # the ranking served now has a memory too: that is what a new one must beat
        fq, fn, fd = out.terms(served_memory)
        out.served = base + served_memory.w_query * fq + served_memory.w_near * fn + served_memory.w_doc * fd
    return out


def fold_of(key: str, cfg) -> int:
    """The selection fold of a query that is not held out (split by query): the same in every run (the held-out
    share's inner folds of the cross-fitted guard)."""
    return inner_fold(key, 0, cfg)


def spread(folds: list[Scored]) -> float:
    """Median over lists of the std of the served scores of its 10 best candidates: the unit of the weight grid."""
    tops = [np.sort(row[np.isfinite(row)])[::-1][:10] for s in folds for row in s.base]
    stds = [float(np.std(t)) for t in tops if len(t) > 1]
    return float(np.median(stds)) if stds and np.median(stds) > 0 else 1.0


def select(folds: list[tuple[list[Shown], Scored]], props, unit: float, vectors: dict,
           doc_gate: float | None = None, doc_related: str | float = "off", exposure: dict | None = None
           ) -> tuple[dict, list]:
    """The weights (w_q, w_n, w_d), m, near_min and near_k with the best mean IPS-DCG over the grid on the judged
    answers of every fold (each fold: the answers its memory is counted from, and the clicked answers it is judged
    on, whose queries those never include when split by query), and the grid's best results. A choice must beat the
    ranking without a memory (none does: all weights 0, nothing to publish), not the memory served now: on answers
    that memory ranked the estimate favours it (memory_verdict), and the held-out guard judges the choice against
    both. `doc_gate` (`cfg.doc_gate`): the per-document term counts only for a list whose query the memory knows
    (ClickMemory.knows), as it will be served. With `doc_related` "select" (`cfg.doc_related`) a second pass
    (`doc_pass`) then chooses the per-document term's weight again under a gate on the users who clicked each
    document (ClickMemory.doc_related, from DOC_RELATED_GRID, or none), the rest of the choice held: the whole grid
    over the gate too would cost four times the first pass. A cosine as `doc_related` gates the term at it throughout
    instead. With `exposure` (Logs.exposure; `cfg.estimate` "dr") each estimate is doubly robust: a candidate no
    answer of its query showed is credited with a direct-method estimate of its clicks (sieve/training/memory_dr.py),
    fitted for each m, near_min and near_k on the judged queries' shown candidates."""
    fixed = doc_related if isinstance(doc_related, float) else None
    unseen = [memory_dr.Unseen.of(s, exposure) for _, s in folds] if exposure is not None else None
    judged = [s for _, s in folds]
    answers = sum(len(s.lists) for s in judged)
    served = sum(float(s.dcg().sum()) for s in judged) / answers
    none = sum(float(s.none().sum()) for s in judged) / answers
    bases = [s.judged(s.base) for s in judged]  # -inf where not ranked: the memory's terms leave it there
    targets = [GridTargets(s.lists.targets, base) for s, base in zip(judged, bases)]
    best, best_value, results = {"w_query": 0.0, "w_doc": 0.0, "w_near": 0.0, "pseudo": PSEUDO_GRID[0],
                                 "near_min": NEAR_GRID[-1], "near_k": NEAR_K_GRID[0], "doc_gate": None,
                                 "doc_related": None}, none, []
    tallies = [tally(counted, props) for counted, _ in folds]
    counted = {m: [ClickMemory.build(t, 1.0, 1.0, m, w_near=1.0, vectors=vectors, doc_related=fixed) for t in tallies]
               for m in PSEUDO_GRID}
    for m in PSEUDO_GRID[1:]:  # one fold's remembered queries whatever m: one matrix, so Scored keeps its cosines
        counted[m] = [replace(memory, near_vectors=first.near_vectors) if memory.near_keys == first.near_keys
                      else memory for memory, first in zip(counted[m], counted[PSEUDO_GRID[0]])]
    gates = [s.known(memory, doc_gate) for memory, s in zip(counted[PSEUDO_GRID[0]], judged)] \
        if doc_gate is not None else []  # the same remembered queries whatever m
    doc_terms: dict[float, list[np.ndarray]] = {}
    for m, near_min, near_k in itertools.product(PSEUDO_GRID, NEAR_GRID, NEAR_K_GRID):
        memories = [replace(memory, near_min=near_min, near_k=near_k) for memory in counted[m]]
        terms = [s.terms(memory) for memory, s in zip(memories, judged)]
        known = any(fq.any() for fq, _, _ in terms)  # no judged query remembered (split by query): w_q changes nothing
        if doc_gate is not None:  # the per-document term only for the lists whose query the memory knows
            terms = [(fq, fn, fd * gate) for (fq, fn, fd), gate in zip(terms, gates)]
        doc_terms.setdefault(m, [fd for _, _, fd in terms])  # f(doc) depends on m only (and the fixed gate)
        gathered = [(t.gather(fq), t.gather(fn), t.gather(fd)) for t, (fq, fn, fd) in zip(targets, terms)]
        credits = credited(unseen, terms, judged)
        for a, c in itertools.product(W_GRID, W_GRID):
            if (a and not known) or (not c and (near_min, near_k) != (NEAR_GRID[-1], NEAR_K_GRID[0])):
                continue  # the same ranking as a configuration the grid scores anyway
            partial = [a * fq + c * fn for fq, fn, _ in gathered]  # (a fq + c fn) + b fd, as written in full
            for b in W_GRID:
                if not (a or b or c):
                    continue  # no memory
                value = (sum(t.total(t.base + unit * (part + b * fd))
                             for t, part, (_, _, fd) in zip(targets, partial, gathered))
                         + sum(cr.total(a * unit, c * unit, b * unit) for cr in credits)) / answers
                choice = {"w_query": a * unit, "w_doc": b * unit, "w_near": c * unit, "pseudo": m,
                          "near_min": near_min, "near_k": near_k, "doc_gate": doc_gate if b else None,
                          "doc_related": fixed if b else None}
                results.append({**choice, "validation_ips_dcg": round(value, 5)})
                if value > best_value + 1e-12:
                    best, best_value = choice, value
    if doc_related == "select":
        best, best_value = doc_pass(best, best_value, judged, bases, counted, doc_terms[best["pseudo"]], unit,
                                    answers, doc_gate, results, unseen)
    return best, [{"served_validation_ips_dcg": round(served, 5), "no_memory_validation_ips_dcg": round(none, 5),
                   "folds": len(folds), "validation_answers": answers}] + sorted(
        results, key=lambda r: -r["validation_ips_dcg"])[:10]


def credited(unseen: list[memory_dr.Unseen] | None, terms: list, judged: list[Scored]) -> list[memory_dr.Credit]:
    """The doubly-robust estimate's direct-method part of each judged fold for these terms (none: IPS alone)."""
    if unseen is None:
        return []
    beta = memory_dr.fit(unseen, terms)
    return [memory_dr.Credit.of(u, beta, t, s.base) for u, t, s in zip(unseen, terms, judged)]


class GridTargets:
    """One judged fold's click targets for select()'s weight grid, gathered once: each target's list row (a list
    appears once per target it has) of the scores and terms, so a weight combination costs arithmetic on those rows
    and the targets' ranks (ips_dcg's, summed over the fold) rather than a pass over every list and a new gather
    (the grid makes tens of thousands)."""

    def __init__(self, targets: np.ndarray, base: np.ndarray):
        self.rows, self.cols = np.nonzero(targets)
        self.weights = targets[self.rows, self.cols]
        self.before = np.arange(base.shape[1]) < self.cols[:, None]  # (n, K) earlier in the list: ranked first on a tie
        self.base = base[self.rows]

    def gather(self, values: np.ndarray) -> np.ndarray:
        return values[self.rows]

    def total(self, scores: np.ndarray) -> float:
        """The fold's summed IPS-DCG (ips_dcg) of gathered `scores` ((n, K))."""
        rank = target_ranks(scores, self.cols, self.before)
        return float((self.weights / np.log2(2.0 + rank)).sum())


def doc_pass(best: dict, best_value: float, judged: list[Scored], bases: list[np.ndarray], counted: dict,
             doc_terms: list[np.ndarray], unit: float, answers: int, doc_gate: float | None, results: list,
             unseen: list[memory_dr.Unseen] | None = None) -> tuple[dict, float]:
    """select()'s second pass: the per-document term's clicker gate (`doc_related` over DOC_RELATED_GRID) and its
    weight (W_GRID), the rest of the choice held (`doc_terms`: the term's values at the chosen m, ungated); kept only
    where it beats the choice (ties: the choice). The gate reads the memory of the chosen m (which queries clicked a
    document does not depend on m)."""
    memories = [replace(memory, near_min=best["near_min"], near_k=best["near_k"]) for memory in counted[best["pseudo"]]]
    kept = [(fq, fn) for fq, fn, _ in (s.terms(memory) for memory, s in zip(memories, judged))]
    closest = [s.closest(memory) for memory, s in zip(memories, judged)]
    a, c = best["w_query"] / unit, best["w_near"] / unit
    credits = {related: credited(unseen, [(fq, fn, fd * (near >= related)) for (fq, fn), fd, near
                                          in zip(kept, doc_terms, closest)], judged) for related in DOC_RELATED_GRID}
    for related, b in itertools.product(DOC_RELATED_GRID, W_GRID[1:]):  # a gate on a weight of 0 changes nothing
        value = (sum(float(ips_dcg(base + unit * (a * fq + c * fn + b * fd * (near >= related)), s.lists).sum())
                     for s, base, (fq, fn), fd, near in zip(judged, bases, kept, doc_terms, closest))
                 + sum(cr.total(a * unit, c * unit, b * unit) for cr in credits[related])) / answers
        choice = {**best, "w_doc": b * unit, "doc_related": related, "doc_gate": doc_gate}
        results.append({**choice, "validation_ips_dcg": round(value, 5)})
        if value > best_value + 1e-12:
            best, best_value = choice, value
    return best, best_value


def memory_verdict(guard: dict, cfg) -> str | None:
    """Why a new memory must not be published (None: publish). The first memory must clearly beat the served ranking
    (feedback_learn.verdict: the 95% lower bound of the held-out IPS-DCG difference above 0). An update, judged on
    answers the served memory ranked itself, must clearly beat the ranking without any memory and must not be below
    the served memory (difference >= 0): the estimate favours the served memory (what it promoted was shown high and
    clicked; what it demoted was seldom shown), so requiring it to be clearly beaten would stop the memory improving
    once one is served (RESULTS.md, the head-query runs). With the cross-fitted guard the intervals are over every
    fold's answers (the pooled folds judge the procedure), and with `--memory-publish fold` fold 0's memory, the one
    published, must also not be below the served ranking (nor, for an update, the ranking without a memory) on its
    own held-out answers. With "refit" the memory published is made from every answer, fold 0's included, so no fold
    has a memory of its own to judge: one fold's point estimate is noise beside the pooled interval (it refused a
    memory worth +0.0095 nDCG@10 on NFCorpus dev at -0.00001, the other folds' up to +0.10: RESULTS.md,
    thirty-fourth session)."""
    own = guard.get("published_fold")  # the cross-fitted guard: fold 0's memory on its own held-out answers
    if own is not None and cfg.memory_publish == "fold":
        below = "served" if own["delta"] is None or own["delta"] < 0 else \
            "without a click memory" if own.get("vs_no_memory", 0.0) < 0 else None
        if below:
            return (f"below the ranking {below} on its own held-out answers ({own['answers']}: IPS-DCG difference "
                    f"{own['delta']}, against no memory {own.get('vs_no_memory')}), whatever the memories made the "
                    f"same way from other queries gave on theirs (pooled {guard['delta']})")
    if "vs_no_memory" not in guard or guard["heldout_answers"] < cfg.min_heldout:
        return verdict(guard, 1, cfg) or charged_below(guard)
    base = guard["vs_no_memory"]
    if base["interval"][0] <= 0:
        return (f"not better than the ranking without a click memory on held-out feedback: IPS-DCG difference "
                f"{base['delta']} with 95% interval {base['interval']} (the lower bound must be above 0)")
    if guard["delta"] < 0:
        return (f"below the served click memory on held-out feedback: IPS-DCG difference {guard['delta']} with 95% "
                f"interval {guard['interval']} (an update must not be below the served memory)")
    return charged_below(guard)


def charged_below(guard: dict) -> str | None:
    """With `cfg.guard_support` "both": why the memory must not be published although it passed on the shown support
    (None: nothing against it): clearly below the served ranking (the 95% interval's upper bound under 0) when the
    estimate ranks every candidate, so that each promotion of a document no held-out answer of its query showed is
    charged (as if it were not relevant). A point estimate under 0 with an interval across it is level, not below:
    over the 39 judged simulation logs in benchmarks/results whose shown-support interval cleared 0, the point rule
    refused one memory (NFCorpus, fortieth session, seed 40: doubly robust -0.0003 [-0.0097, +0.0079]), which gives
    +0.0157 [+0.0071, +0.0247] on NFCorpus dev when forced; the harmful memories forced onto a dev log in the
    twenty-ninth session were clearly below (upper bounds -0.08 to -0.94 in that session's IPS estimate), and so is the
    adversarial-clicks test's."""
    charged = guard.get("charged")
    if charged is None or charged["interval"][1] >= 0:
        return None
    if charged.get("estimate") == "dr":
        return (f"below the served ranking on held-out feedback over every candidate, each promotion of a document no "
                f"answer of its query showed credited with what documents like it were clicked for (doubly robust): "
                f"difference {charged['delta']} with 95% interval {charged['interval']} (it must not be wholly below 0)")
    return (f"below the served ranking on held-out feedback once every promotion of a document no answer of its "
            f"query showed is charged: IPS-DCG difference {charged['delta']} with 95% interval {charged['interval']} "
            f"(it must not be wholly below 0)")


def selection_folds(cfg, parts: dict, entries: list[Entry], held_from, val_from,
                    score) -> list[tuple[list[Shown], Scored]]:
    """Split by time: one fold, the memory counted from the fit answers and judged on the validation answers. Split
    by query: `cfg.memory_folds` folds of the queries that are not held out, each judged on its clicked answers with
    the memory counted from the other folds' answers, so every remaining answer can select (up to
    `cfg.memory_select_answers` of them, whole queries drawn by hash: the grid's cost grows with them), several times
    the validation answers of one 10% share (a less noisy choice), and the held-out answers stay untouched for the
    guard."""
    def single() -> list[tuple[list[Shown], Scored]]:
        validation = [e for e in entries if side(e.key, e.t, held_from, val_from, cfg) == "validation"]
        return [(parts["fit"], score(validation))]

    if cfg.split != "query" or cfg.memory_folds < 2:
        return single()
    candidates = [e for e in entries if side(e.key, e.t, held_from, val_from, cfg) != "heldout"]
    judged = drawn(candidates, lambda key: fold_of(key, cfg), cfg)
    if not any(judged):  # a few queries with many answers each, none drawn under the cap: one fold, as split by time
        return single()
    return query_folds(parts["fit"] + parts["validation"], judged, lambda key: fold_of(key, cfg), score)


def drawn(candidates: list[Entry], fold, cfg) -> list[list[Entry]]:
    """The clicked answers each selection fold (`fold(key)`) is judged on: up to `cfg.memory_select_answers` of
    `candidates`, whole queries drawn by hash (the cost of the grid grows with them)."""
    judged = [[] for _ in range(cfg.memory_folds)]
    share = min(1.0, cfg.memory_select_answers / max(len(candidates), 1))
    for e in candidates:
        if bucket(e.key + "/select") < share:
            judged[fold(e.key)].append(e)
    return judged


def query_folds(rest: list[Shown], judged: list[list[Entry]], fold, score) -> list[tuple[list[Shown], Scored]]:
    """Per selection fold with answers to judge: the answers of `rest` in the other folds (what its memory counts)
    and its judged answers, scored."""
    return [([a for a in rest if fold(a.key) != j], score(answers)) for j, answers in enumerate(judged) if answers]


def without_noise(judged: Scored, credit: dict[tuple[str, str], float], rate: float, spread: bool = False) -> None:
    """The affine correction (sieve/feedback/noise.py) of the estimate on `judged`: from each document the answers of
    a judged query showed, b x the credit noise alone would earn it (`credit`: noise.expected_noise over every answer
    of those queries the estimate's clicks come from), as negative targets (one query's lists rank the same
    candidates), so a shown document is worth (a - b) x its relevance and one no answer showed 0. On the query's first
    list (the mean over answers is what selection compares), or with `spread` an equal share on each (the guard's
    bootstrap resamples answers)."""
    lists: dict[str, list[int]] = {}
    for i, key in enumerate(judged.lists.keys):
        lists.setdefault(key, []).append(i)
    targets = judged.lists.targets.copy()
    at = {i: {doc: j for j, doc in enumerate(judged.ids[i]) if doc is not None}
          for rows in lists.values() for i in (rows if spread else rows[:1])}
    for (key, doc), value in credit.items():
        rows = lists.get(key, [])
        rows = rows if spread else rows[:1]
        for i in rows:
            j = at[i].get(doc)
            if j is not None:
                targets[i, j] -= rate * value / len(rows)
    judged.lists.targets = targets


def noise_of(counts: Tallies) -> Noise | None:
    """The click-noise fit (noise.estimate) over the counted (query, document) pairs."""
    cells = list(counts.pairs.values())
    return estimate([c for c, _ in cells], [e for _, e in cells])


def learn_memory(cfg, logs, props, index, served_scores, served_memory, clip: float) -> tuple[ClickMemory | None, dict]:
    """The memory to publish (None: refused, with the reason in the report) and the report."""
    answers = logs.answers()
    held_from, val_from = time_cuts(answers, cfg)
    parts: dict[str, list[Shown]] = {"fit": [], "validation": [], "heldout": []}
    for a in answers:
        parts[side(a.key, a.t, held_from, val_from, cfg)].append(a)
    exposure = logs.exposure(props) if "policy" in (cfg.propensities, cfg.guard_propensities) \
        or cfg.support == "shown" or cfg.guard_support in ("shown", "both") or cfg.estimate == "dr" else {}
    entries, _ = logs.entries(props, clip, cfg.propensities, exposure)  # what selects
    guarded = entries if cfg.guard_propensities == cfg.propensities else \
        logs.entries(props, clip, cfg.guard_propensities, exposure)[0]  # what the guard judges on
    lists = {"validation": [e for e in entries if side(e.key, e.t, held_from, val_from, cfg) == "validation"],
             "heldout": [e for e in guarded if side(e.key, e.t, held_from, val_from, cfg) == "heldout"]}
    report = {"answers": {k: len(v) for k, v in parts.items()},
              "clicked_answers": {k: len(v) for k, v in lists.items()}}
    if sum(bool(a.clicked) for a in parts["fit"]) < 20 or not lists["validation"]:
        report["not_installed"] = "too little feedback"
        return None, report
    work = Fitting(cfg, props, index, served_scores, served_memory, clip, exposure,
                   {imp["query_key"]: unpack(imp["vector"]) for imp in logs.impressions.values() if "vector" in imp})
    if cross_fitted(cfg, len(entries)):
        memory, guard = crossfit(work, answers, entries, guarded, report)
    else:
        folds = selection_folds(cfg, parts, entries, held_from, val_from, work.score)
        memory, noise = work.fit(parts["fit"] + parts["validation"], folds, parts["validation"], report)
        diffs = work.judge(memory, noise, lists["heldout"], parts["heldout"])
        guard = guard_report(diffs, cfg)
    report["guard"] = {"kind": "crossfit" if "crossfit_folds" in guard else "heldout", **guard}
    if memory is None:  # cross-fitted, and the held-out share's memory had nothing to select on
        report["not_installed"] = "too little feedback"
        return None, report
    if not (memory.w_query or memory.w_doc or memory.w_near):
        refused = "no memory weight beat the ranking without a memory on the validation answers"
    else:
        refused = memory_verdict(report["guard"], cfg)
    report["entries"] = len(memory)
    if refused:
        report["not_installed"] = refused
        return None, report
    if report["guard"]["kind"] == "crossfit" and cfg.memory_publish == "refit":
        memory = refit(work, answers, entries, report)
        if memory is None or not (memory.w_query or memory.w_doc or memory.w_near):
            report["not_installed"] = "refitted on every answer, no memory weight beat the ranking without a memory"
            return None, report
        report["entries"] = len(memory)
    memory.about["guard"] = report["guard"]
    return memory, report


def refit(work: Fitting, answers: list[Shown], entries: list[Entry], report: dict) -> ClickMemory | None:
    """The cross-fitted guard's procedure applied to every answer (`cfg.memory_publish` "refit"): the weights selected
    on `memory_folds` folds of all the queries, the memory counted from all the answers. The guard judged this
    procedure on every share of the queries with the memory it made from the other shares; the memory it makes from
    all of them is the one published (cross-validation's refit: the held-out share's clicks are counted too, instead
    of only judging). `report` keeps fold 0's choice as `judged_fold_chosen` and takes the refit's."""
    chosen = report.get("chosen")
    made = procedure(work, answers, entries, functools.partial(all_fold, cfg=work.cfg), report)
    if made is None:
        return None
    memory = made[0]
    report["judged_fold_chosen"] = chosen
    report["published"] = memory.about["published"] = "refit on every answer"
    return memory


def procedure(work: Fitting, answers: list[Shown], entries: list[Entry], fold, into: dict | None
              ) -> tuple[ClickMemory, Noise | None] | None:
    """The memory the cross-fitted procedure makes from `answers`: weights selected on the selection folds `fold(key)`
    cuts their queries into (judged on `entries` drawn under the cap; one fold when the cap draws none), counted from
    all of `answers`. None: no fold has a clicked answer to select on."""
    judged = drawn(entries, fold, work.cfg)
    if not any(judged):  # a few queries with many answers each, none drawn under the cap: one inner fold judges
        judged[0] = [e for e in entries if fold(e.key) == 0]
    folds = query_folds(answers, judged, fold, work.score)
    return work.fit(answers, folds, answers, into) if folds else None


@dataclass
class Fitting:
    """What every memory of one `learn_memory` run is chosen, counted and judged with."""
    cfg: object
    props: object
    index: object
    served_scores: object
    served_memory: ClickMemory | None
    clip: float
    exposure: dict
    vectors: dict

    def score(self, judged: list[Entry], support: str | None = None) -> Scored:
        support = self.cfg.support if support is None else support
        return scored(judged, self.index, self.cfg.depth, self.served_scores, self.served_memory,
                      self.exposure if support == "shown" else None)

    def fit(self, counted: list[Shown], folds: list[tuple[list[Shown], Scored]], pool: list[Shown],
            report: dict | None = None) -> tuple[ClickMemory, Noise | None]:
        """The memory counted from `counted` with the weights selected on `folds` (noise-corrected with the credit
        over `pool` when the noise is estimated; split by query the pool is `counted`)."""
        cfg = self.cfg
        unit = spread([s for _, s in folds])
        counts, noise = tally(counted, self.props), None
        if cfg.noise == "estimated":
            noise = noise_of(counts)
            if report is not None:
                report["noise"] = noise.as_dict() if noise else "too few examined (query, document) pairs to estimate"
            if noise:
                credit = expected_noise(pool if cfg.split == "time" else counted, None, self.props,
                                        click_weight(self.props, self.clip,
                                                     self.exposure if cfg.propensities == "policy" else {}))
                for _, judged in folds:
                    without_noise(judged, credit, noise.noise)
        chosen, grid = select(folds, self.props, unit, self.vectors, cfg.doc_gate, cfg.doc_related,
                              self.exposure if cfg.estimate == "dr" else None)
        if report is not None:
            report.update({"score_unit": round(unit, 5), "chosen": chosen, "grid": grid})
        memory = ClickMemory.build(counts, chosen["w_query"], chosen["w_doc"], chosen["pseudo"],
                                   {"answers": len(counted), "propensity": self.props.source},
                                   chosen["w_near"], chosen["near_min"], self.vectors, chosen["near_k"],
                                   chosen.get("doc_gate"), chosen.get("doc_related"))
        return memory, noise

    def judge(self, memory: ClickMemory, noise: Noise | None, guarded: list[Entry], held: list[Shown]
              ) -> dict[str, np.ndarray] | None:
        """Per held-out clicked answer (`guarded`, of the answers `held`) the IPS-DCG difference of `memory` over the
        ranking served now ("served") and, for an update, over the ranking without a memory ("none"); None without
        held-out clicks. `noise`: the fit's, which the estimate is corrected for."""
        if not guarded:
            return None
        both = self.cfg.guard_support == "both"
        out = self.score(guarded, "shown" if both else self.cfg.guard_support)
        if not len(out.lists):
            return None
        if noise:  # the guard's estimate corrected alike, each held-out answer its share
            weight = click_weight(self.props, self.clip,
                                  self.exposure if self.cfg.guard_propensities == "policy" else {})
            without_noise(out, expected_noise(held, None, self.props, weight), noise.noise, spread=True)
        new, served = out.dcg(memory), out.dcg()
        diffs = {"served": new - served, "served_ips_dcg": served}
        if self.served_memory is not None:
            diffs["none"] = new - out.none()
        if both:  # the same answers ranked over every candidate: each promotion of a document none showed charged
            charged = replace(out, shown=None)
            diffs["charged"] = charged.dcg(memory) - charged.dcg()
            if self.cfg.estimate == "dr":  # or credited with what the documents like it were clicked for
                diffs["charged"] = diffs["charged"] + self.credit(out, memory)
        return diffs

    def credit(self, out: Scored, memory: ClickMemory) -> np.ndarray:
        """(Q,) per judged answer the doubly-robust estimate's direct-method part (memory_dr) of `memory` over the
        ranking served now, fitted on these answers' queries' shown candidates."""
        unseen = memory_dr.Unseen.of(out, self.exposure)
        terms = out.terms(memory)
        credit = memory_dr.Credit.of(unseen, memory_dr.fit([unseen], [terms]), terms, out.base)
        served = out.base if out.served is None else out.served
        return credit.per_list((memory.w_query, memory.w_near, memory.w_doc), served)


def guard_report(diffs: dict[str, np.ndarray] | None, cfg) -> dict:
    if diffs is None:
        return {"heldout_answers": 0, "delta": None, "interval": None}
    guard = {**compare(diffs["served"], cfg), "served_ips_dcg": round(float(diffs["served_ips_dcg"].mean()), 5)}
    if "none" in diffs:  # an update: also judged against the ranking without any memory
        guard["vs_no_memory"] = compare(diffs["none"], cfg)
    if "charged" in diffs:  # guard_support "both": the same difference over every candidate
        guard["charged"] = compare(diffs["charged"], cfg) | ({"estimate": "dr"} if cfg.estimate == "dr" else {})
    return guard


def cross_fitted(cfg, clicked: int) -> bool:
    """Whether the guard is cross-fitted (`cfg.memory_guard`; split by query only): "auto" up to
    cfg.crossfit_max_answers clicked answers."""
    if cfg.split != "query":
        return False
    return cfg.memory_guard == "crossfit" or (cfg.memory_guard == "auto" and clicked <= cfg.crossfit_max_answers)


def guard_folds(cfg) -> int:
    """The cross-fitted guard's folds: shares of the queries the size of the default guard's held-out share."""
    return max(int(round(1 / cfg.heldout)), 2)


def guard_fold(key: str, cfg) -> int:
    """A query's fold of the cross-fitted guard: fold 0 is the default guard's held-out share (cfg.heldout), the rest
    of the queries cut into shares of that size (the last one takes what remains)."""
    return min(int(bucket(key) / cfg.heldout), guard_folds(cfg) - 1)


def all_fold(key: str, cfg) -> int:
    """A query's selection fold when every query selects (`refit`): its place in [0, 1) cut into cfg.memory_folds."""
    return min(int(bucket(key) * cfg.memory_folds), cfg.memory_folds - 1)


def inner_fold(key: str, g: int, cfg) -> int:
    """A query's selection fold when guard fold `g` is judged: the other guard folds' queries cut into
    cfg.memory_folds folds by their place in [0, 1) with g's share taken out; for g = 0 (the held-out share) the
    folds of the held-out guard (fold_of), so that memory is the held-out guard's."""
    lo, hi = g * cfg.heldout, (1.0 if g == guard_folds(cfg) - 1 else (g + 1) * cfg.heldout)
    b = bucket(key)
    u = (b if b < lo else b - (hi - lo)) / (1 - (hi - lo))
    return min(max(int(u * cfg.memory_folds), 0), cfg.memory_folds - 1)


def crossfit(work: Fitting, answers: list[Shown], entries: list[Entry], guarded: list[Entry], report: dict
             ) -> tuple[ClickMemory, dict]:
    """The cross-fitted guard (`cfg.memory_guard` "crossfit", split by query): the queries are cut into folds the
    size of the held-out share (guard_fold; fold 0 is that share), and each fold is judged as the held-out share is,
    with the memory the same procedure (selection on inner folds of the other queries, counting) makes from the
    other folds' answers; the guard's interval is over every fold's answers pooled, so all the clicked answers
    judge instead of one share (an interval about half as wide: RESULTS.md, twenty-sixth session). The memory
    returned is fold 0's, the one the held-out guard would judge and publish (memory_verdict also requires it not to
    be below the served ranking on its own fold): the guard judges the procedure that made it, each time on queries
    it never saw. learn_memory publishes it with `cfg.memory_publish` "fold", else the procedure's memory from every
    answer (`refit`). Selection runs once per fold instead of once."""
    cfg = work.cfg
    folds_n = guard_folds(cfg)

    def made_without(g: int, into: dict | None) -> tuple[ClickMemory, Noise | None] | None:
        """Fold g's memory (None: the other folds have no clicked answer to select on)."""
        return procedure(work, [a for a in answers if guard_fold(a.key, cfg) != g],
                         [e for e in entries if guard_fold(e.key, cfg) != g],
                         functools.partial(inner_fold, g=g, cfg=cfg), into)

    pooled: dict[str, list[np.ndarray]] = {}
    per_fold = []
    published = None
    for g in tqdm(range(folds_n), desc="click memory, cross-fitted guard", unit="fold", leave=False):
        made = made_without(g, report if g == 0 else None)
        if made is None:
            continue
        memory, noise = made
        published = memory if g == 0 else published
        diffs = work.judge(memory, noise, [e for e in guarded if guard_fold(e.key, cfg) == g],
                           [a for a in answers if guard_fold(a.key, cfg) == g])
        if diffs is None:
            continue
        per_fold.append({"fold": g, "answers": int(len(diffs["served"])),
                         "delta": round(float(diffs["served"].mean()), 5)}
                        | ({"vs_no_memory": round(float(diffs["none"].mean()), 5)} if "none" in diffs else {})
                        | ({"charged": round(float(diffs["charged"].mean()), 5)} if "charged" in diffs else {}))
        for name, values in diffs.items():
            pooled.setdefault(name, []).append(values)
    guard = guard_report({k: np.concatenate(v) for k, v in pooled.items()} if pooled else None, cfg)
    own = next((f for f in per_fold if f["fold"] == 0), {"fold": 0, "answers": 0, "delta": None})
    guard.update({"crossfit_folds": per_fold, "published_fold": own})
    return published, guard
