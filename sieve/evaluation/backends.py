"""Where eval queries go: the Searcher in this process, or POST /search on a running server.

Both answer one SearchParams with the ranked ids, the pipeline's own per-stage timings and the number of
(query, document) pairs the cross-encoder scored, so the runner cannot tell them apart.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from sieve.pipeline import registry
from sieve.pipeline.searcher import SearchParams


@dataclass
class QueryResult:
    ids: list[str]
    timings_ms: dict[str, float]  # be_encode, cmc_encode, mips, cmc, ce, total: whichever ran
    ce_pairs: int
    ce_scores: dict[str, float] = field(default_factory=dict)  # doc id -> CE score, for the pairs the CE scored


class InProcessBackend:
    def __init__(self, searcher, precision: dict | None = None):
        self.searcher = searcher
        self.precision = precision  # stage -> what it runs in (Components.precision, as /readyz shows it)

    @property
    def stages(self) -> set[str]:
        """Stages whose models are loaded ("cmc", "ce", ...), by registered name."""
        return set(getattr(self.searcher, "models", {}))

    def search(self, params: SearchParams) -> QueryResult:
        outcome = self.searcher.search(params)
        cands = outcome.candidates  # a Qdrant index returns the ids with the candidates
        index = outcome.index if outcome.index is not None else self.searcher.index  # the version that answered
        ids = cands.ids if cands.ids is not None else index.ids(cands.rows)
        ce = outcome.candidates.scores.get("ce")
        scored = {} if ce is None else {i: float(s) for i, s in zip(ids, ce) if not math.isnan(s)}
        pairs = sum(outcome.state.counts.get(spec.name, 0) for spec in registry.stages(registry.CROSS_ENCODER))
        return QueryResult(ids, dict(outcome.state.timings_ms), pairs, scored)

    def describe(self) -> dict:
        s = self.searcher
        return {"mode": "in-process", "index_dir": str(getattr(s.index, "index_dir", s.index.identity())),
                "index_size": s.index.size,
                "index_version": s.index.version,
                "models": {"bi_encoder": s.biencoder.name, "cmc": s.cmc.name if s.cmc else None,
                           "cross_encoder": s.cross_encoder.name if s.cross_encoder else None},
                "ce_lengths": asdict(s.cross_encoder.lengths) if s.cross_encoder else None,
                "precision": self.precision}


class HttpBackend:
    """One keep-alive client against a server that must already answer /readyz."""

    def __init__(self, url: str, timeout_s: float = 300):
        import httpx

        self.url = url.rstrip("/")
        # no-cache: the server computes every answer (no cached result or query vector), so latencies are the models'
        self.client = httpx.Client(base_url=self.url, timeout=timeout_s, headers={"Cache-Control": "no-cache"})
        ready = self.client.get("/readyz")
        if ready.status_code != 200:
            raise RuntimeError(f"{self.url}/readyz answered {ready.status_code}; is the server up and its index loaded?")
        self.ready = ready.json()

    @property
    def stages(self) -> set[str]:
        """Stages with a model that the server has loaded (/readyz `stages`, those that need no model left out)."""
        return {name for names in self.ready["stages"].values() for name in names
                if registry.get(name) is None or registry.get(name).optional}

    def search(self, params: SearchParams) -> QueryResult:
        body = {"query": params.query, "top_k": params.top_k, "retrieve_k": params.retrieve_k,
                "rerank": params.rerank, "cmc_k": params.cmc_k, "cross_encoder": params.cross_encoder}
        if params.retriever is not None:  # unset: the server's default for its index (hybrid with a BM25 part)
            body["retriever"] = params.retriever
        if params.ce_model != "ce":
            body["ce_model"] = params.ce_model
        response = self.client.post("/search", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"POST {self.url}/search answered {response.status_code}: {response.text[:500]}")
        data = response.json()
        timings = {k: v for k, v in data["timings_ms"].items() if v is not None}
        scored = {hit["id"]: hit["scores"]["ce"] for hit in data["results"] if hit["scores"].get("ce") is not None}
        return QueryResult([hit["id"] for hit in data["results"]], timings, self.ce_pairs(params), scored)

    def ce_pairs(self, params: SearchParams) -> int:
        # /search reports no per-stage counts; the CE scores the first cmc_k of the (clamped) retrieved list
        # (with retriever anncur, plus k_i anchor pairs that only the in-process backend counts)
        if not params.cross_encoder:
            return 0
        return min(params.cmc_k, params.retrieve_k, self.ready["index_size"])

    def describe(self) -> dict:
        return {"mode": "http", "server": self.url, **self.ready}

    def close(self) -> None:
        self.client.close()
