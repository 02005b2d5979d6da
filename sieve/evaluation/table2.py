"""The CMC paper's Table 2: cross-encoder nDCG@10 over K' candidates taken from the bi-encoder's top K', or
from CMC's top K' after CMC reranked the bi-encoder's top 64 / 256 / 512.

The cross-encoder is the expensive part (~45 pairs/s on a 2-core CPU) and the configurations overlap heavily
(K'=8 is a prefix of K'=16; BE and CMC mostly pick the same documents), so every (query, document) pair is
scored once, in one CE call per query, and reused. A configuration's CE time is then what its own pairs cost:
each call's wall time split over its pairs in proportion to their token counts.
Runs on the Searcher's components directly (its real Retrieve and CMCRerank stages), never over HTTP.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from sieve.evaluation.dataset import EvalData
from sieve.evaluation.metrics import ndcg_at_k
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.stages import CMCRerank, Retrieve
from sieve.pipeline.state import QueryState

CMC_OVER = (64, 256, 512)
K_PRIMES = (8, 16, 64)


class PairScoreCache:
    """One query's cross-encoder scores and attributed milliseconds, per index row."""

    def __init__(self, cross_encoder, index, query: str):
        self.cross_encoder, self.index, self.query = cross_encoder, index, query
        self.scores: dict[int, float] = {}
        self.ms: dict[int, float] = {}

    def fill(self, rows: Sequence[int]) -> None:
        missing = [row for row in dict.fromkeys(int(r) for r in rows) if row not in self.scores]
        if not missing:
            return
        texts = [doc.full_text for doc in self.index.documents(missing)]
        start = time.perf_counter()
        scores = self.cross_encoder.score(self.query, texts).numpy()  # (n,)
        self.add(missing, texts, scores, (time.perf_counter() - start) * 1000)

    def seed(self, known: Iterable) -> None:
        """Scores a pipeline run already paid for (evaluation.runner.CEScored): reused, with that call's time."""
        for call in known:
            ids = [i for i in call.scores if self.index.has_id(i)]
            if ids:
                rows = [int(r) for r in self.index.rows_for_ids(ids)]
                texts = [doc.full_text for doc in self.index.documents(rows)]
                self.add(rows, texts, np.array([call.scores[i] for i in ids]), call.ms)

    def add(self, rows: Sequence[int], texts: Sequence[str], scores: np.ndarray, elapsed_ms: float) -> None:
        """Record scores; the call's time is split over its pairs in proportion to their token counts."""
        tokens = self.cross_encoder.tokenize_pairs(self.query, list(texts))["attention_mask"].sum(1).double().numpy()
        for row, score, share in zip(rows, scores, tokens / tokens.sum()):
            self.scores[int(row)], self.ms[int(row)] = float(score), elapsed_ms * float(share)

    def lookup(self, rows: Sequence[int]) -> tuple[np.ndarray, float]:
        """(scores (n,), CE ms these pairs cost); scores any pair not seen yet."""
        self.fill(rows)
        return np.array([self.scores[int(r)] for r in rows], dtype=np.float32), sum(self.ms[int(r)] for r in rows)


def candidate_lists(searcher, query: str, cmc_over: Sequence[int]) -> tuple[dict, dict[int, float]]:
    """BE's top max(cmc_over) and CMC's reranking of each prefix of it, keyed (source, cmc_over)."""
    state = searcher.new_state(query)
    searcher.encode_query(state, {"be": searcher.biencoder, "cmc": searcher.cmc.query_tower})
    state = Retrieve(searcher.index, max(cmc_over))(state)
    lists: dict[tuple[str, int | None], Candidates] = {("be", None): state.candidates}
    cmc_ms = {}
    for n in cmc_over:
        head = QueryState(query, state.candidates.take(np.arange(n)), state.query_vectors)
        head = CMCRerank(searcher.cmc, searcher.index)(head)
        lists[("cmc", n)], cmc_ms[n] = head.candidates, head.timings_ms["cmc"]
    return lists, cmc_ms


def score_query(searcher, query: str, judged: Mapping[str, int], cmc_over: Sequence[int],
                k_primes: Sequence[int], known: Iterable = ()) -> dict[tuple, tuple[float, float, float]]:
    """(source, cmc_over, K') -> (nDCG@10, CE ms, CMC ms) for one query; `known`: CE scores already computed."""
    lists, cmc_ms = candidate_lists(searcher, query, cmc_over)
    cache = PairScoreCache(searcher.cross_encoder, searcher.index, query)
    cache.seed(known)
    cache.fill([row for cands in lists.values() for row in cands.rows[:max(k_primes)]])  # one batched CE call
    out = {}
    for (source, n), cands in lists.items():
        for k in k_primes:
            scores, ce_ms = cache.lookup(cands.rows[:k])
            ranked = cands.rerank_head("ce", scores)  # CE order on the head, the source's order below it
            ids = searcher.index.ids(ranked.rows[:10])
            out[(source, n, k)] = (ndcg_at_k(ids, judged, 10), ce_ms, cmc_ms.get(n, 0.0))
    return out


def clamp_sizes(searcher, cmc_over: Sequence[int], k_primes: Sequence[int]) -> tuple[list[int], list[int]]:
    """A corpus smaller than a configuration collapses it onto the whole corpus."""
    size = searcher.index.size
    cmc_over = sorted({min(n, size) for n in cmc_over})
    return cmc_over, sorted({min(k, cmc_over[0]) for k in k_primes})


def run_table2(searcher, data: EvalData, cmc_over: Sequence[int] = CMC_OVER, k_primes: Sequence[int] = K_PRIMES,
               log: Callable[[str], None] = print, known: Mapping[str, list] | None = None) -> dict | None:
    """known: query id -> CE scores the pipelines already computed (evaluation.runner.CEScored), reused."""
    missing = [what for what, model in (("CMC", searcher.cmc), ("a cross-encoder", searcher.cross_encoder)) if model is None]
    if missing:
        log(f"skipping --table2: it needs {' and '.join(missing)}, which is not configured")
        return None
    cmc_over, k_primes = clamp_sizes(searcher, cmc_over, k_primes)
    started = time.perf_counter()
    known = known or {}
    per_query = [score_query(searcher, text, data.qrels[qid], cmc_over, k_primes, known.get(qid, ()))
                 for qid, text in tqdm(data.queries.items(), desc="table2", unit="query")]
    log(f"table2: {len(per_query)} queries in {time.perf_counter() - started:.1f}s")
    return {"queries": len(per_query), "rows": table_rows(per_query, cmc_over, k_primes),
            "ce_ms_method": "every pair is scored once per query: pairs the pipelines already scored are reused with "
                            "their share of that pipeline call's CE time, the rest in one CE call over the union of "
                            "all configurations' pairs; a configuration is charged its pairs' share of the wall time "
                            "of the call that scored them, by token count"}


def table_rows(per_query: list[dict], cmc_over: Sequence[int], k_primes: Sequence[int]) -> list[dict]:
    configs = [("be", None, k) for k in k_primes] + [("cmc", n, k) for n in cmc_over for k in k_primes]
    means = {c: np.mean([q[c] for q in per_query], axis=0) for c in configs}  # (3,): nDCG, CE ms, CMC ms
    reference_ms = means[("be", None, max(k_primes))][1]
    return [{"source": source, "cmc_over": n, "k_prime": k, "ndcg@10": float(means[(source, n, k)][0]),
             "ce_ms_mean": float(means[(source, n, k)][1]), "cmc_ms_mean": float(means[(source, n, k)][2]),
             "ce_time_vs_be64": float(means[(source, n, k)][1] / reference_ms)} for source, n, k in configs]
