"""The stage registry: every stage a request can name is one StageSpec, declared in its own module.

Everything that used to spell stage names by hand is derived from here: the searcher's plan and its checks of
`/search` and `/rerank`, the score columns a candidate list may hold, the response's scores and timings, the
metrics labels (they are the timing keys), the result-cache fingerprint, the `sieve eval` pipelines and the
settings reference (docs/configuration.md).

A stage has one of three roles in a `/search` plan, in this order: a `retriever` produces the candidates (the
request's `retriever`), a `reranker` reorders all of them (`rerank`), a `cross_encoder` scores the head of the
list (`cross_encoder: true` with `ce_model`). `/rerank` takes any stage whose spec has `rerank` (its `model`).

Core stages register when `sieve.stages` is imported; other stages (`sieve.research`, or a user's package) are
found through the `sieve.plugins` entry-point group (`load_plugins`, sieve/plugins.py), or registered directly
with `register`.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from sieve import plugins

RETRIEVER, RERANKER, CROSS_ENCODER = "retriever", "reranker", "cross_encoder"
ROLES = (RETRIEVER, RERANKER, CROSS_ENCODER)
FIRST_STAGE_SCORE = "retrieve"  # the column every retriever writes: the order the first stage ranked by
CLICKS_SCORE = "clicks"  # the column the click memory writes after the last stage (sieve/feedback/memory.py)


@dataclass(frozen=True)
class LoadContext:
    """What a stage's loader gets at start-up: the service settings (the one settings object), the stage's own
    settings (an instance of `spec.settings`, when it declares a class), the device, and what is loaded so far
    (the bi-encoder, the index, the models of stages loaded before it, by stage name)."""

    settings: Any
    device: Any
    biencoder: Any
    index: Any
    loaded: dict[str, Any]
    own: Any = None


@dataclass(frozen=True)
class BuildContext:
    """What `build` gets for one request: the stage's loaded model, the request's index version, how many
    candidates the stage works on (retrieve_k for a retriever, cmc_k (K') for a cross-encoder), the searcher
    options (batching, hybrid) and every loaded model by stage name."""

    model: Any
    index: Any
    k: int
    params: Any
    options: Any
    models: dict[str, Any]


@dataclass(frozen=True)
class RerankContext:
    """What a `/rerank` gets: the request's state (query, deadline), the caller's items and their texts, the
    index version, the stage's model, the bi-encoder and the token limit (`max_tokens`)."""

    state: Any
    items: Any
    texts: list[str]
    index: Any
    model: Any
    biencoder: Any
    options: Any
    max_tokens: int | None
    encode_query: Callable[[dict], None]


@dataclass(frozen=True)
class StageSpec:
    """One stage. `name` is what requests say (`retriever`, `rerank`, `ce_model` or `/rerank`'s `model`).

    build(BuildContext) -> list of pipeline stages (pipeline/stages.py contract) for one /search.
    load(LoadContext) -> the stage's model, or None when the operator has not configured it; no `load` = the
        stage needs no model of its own (it is always available).
    query_towers(model) -> {vector name: TextEncoder}: query encodings the stage reads from state.query_vectors.
    rerank(RerankContext) -> list of stages that rank the caller's texts (state.candidates set), or None when
        the query or candidates could not be encoded in time (the caller's order is returned, partial).
    identity(model) -> JSON-able identity of what changes its answers (weights, lengths): the cache fingerprint.
    settings: its own pydantic-settings class (env prefix SIEVE_), listed in docs/configuration.md; `reads`:
        the fields of the service settings it reads.
    score_keys: the candidate score columns it writes (the first one ranks; default its name);
    timing_keys: the timings_ms keys it records (each a `stage` label of sieve_stage_latency_seconds).
    needs: what it needs from the index ("lexical", or "store:<name>" for an embedding store).
    unavailable: what to do when it is not loaded (the `allowed` of the 4xx answer).
    model_role: its key in /readyz `models` (default its name).
    """

    name: str
    role: str
    summary: str
    build: Callable[[BuildContext], list]
    load: Callable[[LoadContext], Any] | None = None
    query_towers: Callable[[Any], dict] | None = None
    rerank: Callable[[RerankContext], list | None] | None = None
    identity: Callable[[Any], Any] | None = None
    settings: type | None = None
    reads: tuple[str, ...] = ()
    score_keys: tuple[str, ...] = ()
    timing_keys: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    unavailable: str = ""
    model_role: str = ""
    research: bool = False
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"stage {self.name!r}: role {self.role!r} is not one of {ROLES}")
        if not self.name.isidentifier():
            raise ValueError(f"stage name {self.name!r} must be an identifier (it is a JSON key and a label)")

    @property
    def scores(self) -> tuple[str, ...]:
        return self.score_keys or ((FIRST_STAGE_SCORE,) if self.role == RETRIEVER else (self.name,))

    @property
    def timings(self) -> tuple[str, ...]:
        return self.timing_keys or (self.name,)

    @property
    def model_key(self) -> str:
        return self.model_role or self.name

    @property
    def optional(self) -> bool:
        """True when the stage has a model the operator may not have configured."""
        return self.load is not None


_STAGES: dict[str, StageSpec] = {}
_SCORE_KEYS: set[str] = {FIRST_STAGE_SCORE, CLICKS_SCORE}  # every registered score column, kept with _STAGES (read per stage boundary)
_RANKING_KEYS: set[str] = {FIRST_STAGE_SCORE, CLICKS_SCORE}  # the column each stage ranks by


def register(spec: StageSpec, replace: bool = False) -> StageSpec:
    if spec.name in _STAGES and not replace and _STAGES[spec.name] is not spec:
        raise ValueError(f"a stage named {spec.name!r} is already registered")
    _STAGES[spec.name] = spec
    _derive_keys()
    return spec


def unregister(name: str) -> None:
    _STAGES.pop(name, None)
    _derive_keys()


def _derive_keys() -> None:
    global _SCORE_KEYS, _RANKING_KEYS
    _SCORE_KEYS = {FIRST_STAGE_SCORE, CLICKS_SCORE} | {key for spec in _STAGES.values() for key in spec.scores}
    _RANKING_KEYS = {FIRST_STAGE_SCORE, CLICKS_SCORE} | {spec.scores[0] for spec in _STAGES.values()}


@contextmanager
def registered(spec: StageSpec) -> Iterator[StageSpec]:
    """Register `spec` for the duration of a block (tests)."""
    register(spec)
    try:
        yield spec
    finally:
        unregister(spec.name)


def get(name: str) -> StageSpec | None:
    return _STAGES.get(name)


def stages(role: str | None = None) -> list[StageSpec]:
    return [s for s in _STAGES.values() if role is None or s.role == role]


def names(role: str | None = None) -> list[str]:
    return [s.name for s in stages(role)]


def score_keys() -> set[str]:
    """Every score column a candidate list may hold."""
    return _SCORE_KEYS


def ranking_keys() -> set[str]:
    """The column each registered stage ranks by (the first of its score keys)."""
    return _RANKING_KEYS


def timing_keys() -> list[str]:
    keys: list[str] = []
    for spec in _STAGES.values():
        keys += [k for k in spec.timings if k not in keys]
    return keys


def load_plugins() -> list[str]:
    """Register the stages of every installed plugin (sieve/plugins.py: the `sieve.plugins` entry points)."""
    return plugins.load_plugins()
