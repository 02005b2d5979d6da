"""`sieve feedback learn`'s training configuration, light to import (no torch): the command line takes its defaults
from here, so `sieve feedback --help` answers at once."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LearnConfig:
    depth: int = 50  # candidates per list (the top of the logged first-stage list): a step's cost grows with it
    n_layers: int = 1  # attention layers when the served CMC has none (the shipped fusion CMC)
    steps: int = 300
    batch: int = 32
    lr: float = 1e-3
    evidence_lr: float = 1e-3
    teacher: float = 0.5
    heldout: float = 0.2  # share of queries (by hash) kept for the guard
    split: str = "query"  # query: held-out queries never trained on; time: the latest answers (queries repeat)
    validation: float = 0.1  # share of the remaining queries that selects the step kept
    memory_folds: int = 5  # query split: the click memory's weights are chosen on all remaining queries, fold by fold
    memory_select_answers: int = 5000  # at most this many clicked answers (whole queries, by hash) judge those folds
    min_heldout: int = 50  # held-out answers with clicks the guard needs
    bootstrap: int = 1000
    eval_every: int = 50
    seed: int = 0
    # the click weights the click memory is selected on: 1 / its document's exposure over its query's answers (policy),
    # or 1 / p(the rank it was shown at) (position); the CMC learner weighs by position
    propensities: str = "policy"
    guard_propensities: str = "position"  # the click weights of the held-out guard's estimate
    # the candidates the click memory's estimates rank: "all", or "shown" (those some logged answer of the list's query
    # showed: a document no answer showed has no click to count for or against it); selection and guard apart; the
    # guard's "both": judged on "shown", and refused too where the estimate over "all" is clearly below the served
    # ranking, its interval wholly under 0 (memory_learn.charged_below; RESULTS.md, twenty-ninth and fortieth sessions)
    support: str = "all"
    guard_support: str = "both"
    # the click memory's per-document (popularity) term only for a query the memory knows: remembered itself, or with a
    # remembered query at this cosine or more (ClickMemory.doc_gate); None: for every query
    doc_gate: float | None = None
    # the click memory's selection and guard estimates with the click-noise rate removed (sieve/feedback/noise.py:
    # "estimated", from the logs by EM), or as counted ("off")
    noise: str = "estimated"
    # the click memory's selection estimate, and the guard's over every candidate (guard_support "both"): IPS, or
    # doubly robust ("dr": a promoted candidate no answer of its query showed credited with a direct-method estimate
    # of its clicks; sieve/training/memory_dr.py; the default since RESULTS.md, issue 33, thirty-first session)
    estimate: str = "dr"
    # the click memory's per-document term gated on who clicked each document (ClickMemory.doc_related): at a cosine,
    # "select" (a second selection pass tries memory_learn.DOC_RELATED_GRID's cosines and none), or never ("off")
    doc_related: str | float = "select"
    # the click memory's guard: "heldout" (judged on the held-out share of the queries, the memory counted from the
    # rest), "crossfit" (split by query: every share of that size judged in turn with the memory the same
    # procedure makes from the other shares, all answers pooled; memory_learn.crossfit), or "auto": crossfit up to
    # crossfit_max_answers clicked answers (where the held-out share is too few for a tight interval), else heldout
    # (the selection would run five times over a log that large)
    memory_guard: str = "auto"
    crossfit_max_answers: int = 50_000
    # with the cross-fitted guard, the memory published: "refit" (the procedure the guard judged, applied to every
    # answer: memory_learn.refit; the default since RESULTS.md, issue 33, thirty-second session) or "fold" (the one it
    # made without the first share's queries, judged on them)
    memory_publish: str = "refit"
