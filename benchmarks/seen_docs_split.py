"""How much of a trained reranker's test gain comes from documents it saw as relevant in training?

SciFact's test claims often cite abstracts that train claims cite too (and NFCorpus's nearly always do), so a
model trained on the train split can learn a prior over those documents. This splits the test queries into
"seen" (some relevant document is also relevant to a train query) and "unseen", and reports nDCG@10 of the
bi-encoder and of BE+CMC on each. Seen queries are also split by how close each is (bi-encoder cosine) to the
nearest train query about one of its relevant documents: a gain that grows with that similarity is the memory of
queries, which no pseudo-query made from the documents alone can give (issue 25). Usage:
  SIEVE_INDEX_DIR=... SIEVE_CMC_PATH=... python benchmarks/seen_docs_split.py --data ../shared/data/scifact
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from sieve.evaluation.metrics import mean_metric, ndcg_at_k  # noqa: E402
from sieve.evaluation.report import machine_info  # noqa: E402
from sieve.index import read_qrels, read_queries  # noqa: E402
from sieve.pipeline.searcher import SearchParams  # noqa: E402
from sieve.service.components import load_components  # noqa: E402
from sieve.service.config import Settings  # noqa: E402


BINS = (0.0, 0.7, 0.8, 0.9, 1.01)  # cosine to the nearest train query about the same document


def relevant(qrels: dict) -> set[str]:
    return {d for judged in qrels.values() for d, g in judged.items() if g > 0}


def nearest_train_query(searcher, queries: dict, test: dict, train: dict) -> dict[str, float]:
    """Test query id -> cosine to the closest train query that shares a relevant document (seen queries only)."""
    by_doc: dict[str, list[str]] = {}
    for q, judged in train.items():
        for d in relevant({q: judged}):
            by_doc.setdefault(d, []).append(q)
    ids = [q for q in {*test, *train} if q in queries]
    encoder = searcher.biencoder
    vectors = dict(zip(ids, encoder.encode([queries[q] for q in ids], encoder.lengths.query_max_length)))
    out = {}
    for q, judged in test.items():
        partners = {t for d in relevant({q: judged}) for t in by_doc.get(d, ()) if t in vectors}
        if partners:
            out[q] = max(float(vectors[q] @ vectors[t]) for t in partners)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--train-splits", default="train", help="comma-separated splits the model trained on")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    test = read_qrels(args.data / "qrels" / "test.tsv")
    train = {q: j for s in args.train_splits.split(",") for q, j in read_qrels(args.data / "qrels" / f"{s}.tsv").items()}
    seen_docs = relevant(train)
    queries = read_queries(args.data / "queries.jsonl")
    searcher = load_components(Settings()).searcher
    runs = {"be": {}, "be+cmc": {}}
    for qid in test:
        for name, rerank in (("be", "none"), ("be+cmc", "cmc")):
            out = searcher.search(SearchParams(queries[qid], top_k=10, retrieve_k=512, rerank=rerank, retriever="be"))
            runs[name][qid] = searcher.index.ids(out.candidates.rows)
    groups = {"all": test,
              "seen": {q: j for q, j in test.items() if relevant({q: j}) & seen_docs},
              "unseen": {q: j for q, j in test.items() if not relevant({q: j}) & seen_docs}}
    table = {g: {"queries": len(qr), **{n: round(mean_metric(ndcg_at_k, r, qr, 10), 4) for n, r in runs.items()}}
             for g, qr in groups.items() if qr}
    nearest = nearest_train_query(searcher, queries, test, train)
    for lo, hi in zip(BINS, BINS[1:]):
        qr = {q: j for q, j in test.items() if q in nearest and lo <= nearest[q] < hi}
        if qr:
            table[f"seen, cos [{lo}, {min(hi, 1.0)})"] = {
                "queries": len(qr), **{n: round(mean_metric(ndcg_at_k, r, qr, 10), 4) for n, r in runs.items()}}
    print("| queries | n | be nDCG@10 | be+cmc nDCG@10 |\n|---|---|---|---|")
    for g, row in table.items():
        print(f"| {g} | {row['queries']} | {row['be']} | {row['be+cmc']} |")
    if args.out:
        args.out.write_text(json.dumps({"dataset": args.data.name, "split": "test", "groups": table,
                                        "nearest_train_query_cos": nearest, "machine": machine_info(),
                                        "command": " ".join(["python", *sys.argv])}, indent=2))


if __name__ == "__main__":
    main()
