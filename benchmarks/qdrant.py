"""The index on Qdrant vs the local index: quality on a BEIR split, and latency / writes / recall at two sizes.

quality: nDCG@10 of be, bm25, hybrid and the default pipeline (hybrid+cmc, the shipped cmc-fusion) through the local
  index and through a Qdrant collection (the client's local mode, in process), same bi-encoder vectors (one
  embedding cache) and the same analyzer.
rows (--sizes, --row-backends): per backend and size, `Searcher.search` p50 / p95 and QPS (one client, in process:
  the /search pipeline without HTTP) for be (rerank none) and hybrid+cmc over SYNTHETIC documents (random unit
  vectors, texts of random words from the split's corpus: labelled "synthetic" in the JSON), the build time, the
  median one-document write (local: a new index version on disk; Qdrant: upsert + generation, acknowledged), and
  the dense recall@512 against the exact inner-product top 512. No Qdrant server runs here: "qdrant-local" is the
  client's local mode (exact, pure Python; --local-mode-queries caps its timed and recall queries, it is too slow
  for more at 100k), whose latencies say nothing of a server's; "qdrant-edge" is qdrant-edge-py (Qdrant's Rust
  shard engine in process, HNSW built by `optimize()` after the load).
--merge: rows replace those of the same backend and size in --out, the rest of --out (quality rows) is kept; the
  file is written after every row, so a run stopped part-way keeps what it measured.
Usage:
  python benchmarks/qdrant.py --data ../shared/data/scifact --sizes 10000 100000 --out benchmarks/results/qdrant.json
  python benchmarks/qdrant.py --data ../shared/data/scifact --skip-quality --sizes 10000 100000 --merge
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cmc_latency import machine  # noqa: E402
import sieve.stages  # noqa: E402,F401 (the core stages register)
from sieve import checkpoints  # noqa: E402
from sieve.evaluation.backends import InProcessBackend  # noqa: E402
from sieve.evaluation.dataset import load_split  # noqa: E402
from sieve.evaluation.runner import EvalConfig, run_pipelines  # noqa: E402
from sieve.index import Document, SearchIndex, apply_changes, build_index, read_beir_corpus  # noqa: E402
from sieve.index.qdrant_backend import QdrantConfig  # noqa: E402
from sieve.index.qdrant_build import build_qdrant  # noqa: E402
from sieve.models.cmc_checkpoint import load_cmc  # noqa: E402
from sieve.models.text_encoder import EncoderLengths, TextEncoder  # noqa: E402
from sieve.models.weights import default_model_path  # noqa: E402
from sieve.pipeline.searcher import Searcher, SearchParams  # noqa: E402

PIPELINES = ["be", "bm25", "hybrid", "hybrid+cmc"]


def open_backend(name: str, docs, biencoder, cache_dir: Path, workdir: Path):
    if name == "local":
        build_index(docs, biencoder, workdir / "local", cache_dir=cache_dir, progress=True)
        return SearchIndex.load(workdir / "local")
    config = QdrantConfig(str(workdir / "edge"), "quality", engine="edge") if name == "qdrant-edge" else \
        QdrantConfig(":memory:", "quality")
    return build_qdrant(docs, {"primary": biencoder}, config, cache_dir=cache_dir)


def quality(data_dir: Path, cache_dir: Path, biencoder, workdir: Path, max_queries: int | None,
            backends: list[str]) -> list[dict]:
    """Searchers stay open until every backend has run (closing one before the next started stalled the next's
    query batcher in one run here; not investigated)."""
    docs = read_beir_corpus(data_dir / "corpus.jsonl")
    split = load_split(data_dir, "test", max_queries=max_queries)
    cmc = load_cmc(checkpoints.shipped(checkpoints.CMC), biencoder)
    results, searchers = {}, []
    for name in backends:
        searchers.append(Searcher(biencoder, open_backend(name, docs, biencoder, cache_dir, workdir), cmc=cmc))
        results[name] = run_pipelines(InProcessBackend(searchers[-1]), split, PIPELINES, EvalConfig())
    for searcher in searchers:
        searcher.close()
    return [{"dataset": data_dir.name, "split": "test", "queries": len(split.queries), "pipeline": p,
             **{name: round(results[name][p]["ndcg@10"], 4) for name in backends}} for p in PIPELINES]


class Precomputed:
    """A document encoder that returns given vectors by text (the synthetic corpora: no model in the timing)."""

    def __init__(self, texts: list[str], vectors: np.ndarray, like):
        self.rows = {t: i for i, t in enumerate(texts)}
        self.vectors, self.name, self.weights_hash, self.dim = vectors, like.name, like.weights_hash, like.dim
        self.max_length = like.max_length
        self.rng = np.random.default_rng(1)

    def encode_documents(self, texts, progress: bool = False) -> np.ndarray:
        out = [self.vectors[self.rows[t]] if t in self.rows else unit(self.rng.standard_normal(self.dim)) for t in texts]
        return np.asarray(out, dtype=np.float32).reshape(len(texts), self.dim)


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def synthetic(n: int, words: list[str], dim: int, seed: int = 0) -> tuple[list[Document], np.ndarray]:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(words), size=(n, 40))
    docs = [Document(f"s{i}", "", " ".join(words[j] for j in row)) for i, row in enumerate(picks)]
    return docs, unit(rng.standard_normal((n, dim)))


def timed_searches(searcher, queries: list[str], params: dict) -> dict:
    searcher.search(SearchParams(queries[0], **params))  # warm-up
    times = []
    started = time.perf_counter()
    for q in queries:
        t = time.perf_counter()
        searcher.search(SearchParams(q, **params))
        times.append((time.perf_counter() - t) * 1000)
    total = time.perf_counter() - started
    return {"p50_ms": round(float(np.percentile(times, 50)), 2), "p95_ms": round(float(np.percentile(times, 95)), 2),
            "qps": round(len(queries) / total, 2), "queries": len(queries)}


def recall_at(index, vectors: np.ndarray, queries: np.ndarray, k: int = 512) -> float:
    found = []
    for q in queries:
        exact = set(np.argsort(-(vectors @ q))[:k].tolist())
        hits = index.dense_hits(q, k)
        rows = [int(i[1:]) for i in hits.ids] if hits.ids is not None else hits.rows.tolist()  # ids are s<row>
        found.append(len(exact & set(rows)) / k)
    return round(float(np.mean(found)), 4)


def write_latency(write, n: int = 10) -> float:
    times = []
    for i in range(n):
        t = time.perf_counter()
        write(Document(f"w{i}", "", f"written document number {i} about synthetic benchmarking"))
        times.append((time.perf_counter() - t) * 1000)
    return round(float(np.median(times)), 2)


def built(name: str, n: int, docs, encoder, workdir: Path):
    """(index, write one document) for a row's backend."""
    if name == "local":
        where = workdir / f"local-{n}"
        build_index(docs, encoder, where, cache_dir=None, progress=False)
        return SearchIndex.load(where), lambda d: apply_changes(where, [d], [], {"primary": encoder})
    config = QdrantConfig(":memory:", f"s{n}") if name == "qdrant-local" else \
        QdrantConfig(str(workdir / f"edge-{n}"), f"s{n}", engine="edge")
    index = build_qdrant(docs, {"primary": encoder}, config, progress=False, batch=1024)
    return index, lambda d: index.upsert([d], {"primary": encoder.encode_documents([d.full_text])})


def size_rows(n: int, words: list[str], queries: list[str], biencoder, workdir: Path, n_queries: dict[str, int],
              backends: list[str], on_row) -> None:
    docs, vectors = synthetic(n, words, biencoder.dim)
    encoder = Precomputed([d.full_text for d in docs], vectors, biencoder)
    cmc = load_cmc(checkpoints.shipped(checkpoints.CMC), biencoder)
    qvecs = unit(np.random.default_rng(2).standard_normal((50, biencoder.dim)))
    for name in backends:
        started = time.perf_counter()
        index, write = built(name, n, docs, encoder, workdir)
        row = {"backend": name, "docs": n, "corpus": "synthetic (random unit vectors, random corpus words)",
               "build_s": round(time.perf_counter() - started, 1)}
        searcher, some = Searcher(biencoder, index, cmc=cmc), queries[:n_queries[name]]
        row["be"] = timed_searches(searcher, some, {"retriever": "be", "rerank": "none", "top_k": 10})
        row["hybrid+cmc"] = timed_searches(searcher, some, {"retriever": "hybrid", "rerank": "cmc", "top_k": 10})
        row["recall@512"] = recall_at(index, vectors, qvecs[:n_queries[name]])
        row["recall_queries"] = len(qvecs[:n_queries[name]])
        searcher.close()
        if name == "local":
            index.close()  # a write is a new version on disk, written by apply_changes
        row["write_one_ms"] = write_latency(write)
        if name != "local":
            index.close()
        print(json.dumps(row), flush=True)
        on_row(row)


def merged(old: dict | None, run: dict) -> dict:
    """This run's results over an earlier file's (rows keyed by backend and size; None: this run's alone)."""
    if old is None:
        return run
    fresh = {(r["backend"], r["docs"]) for r in run["rows"]}
    kept = [r for r in old.get("rows", []) if (r["backend"], r["docs"]) not in fresh]
    commands = old.get("commands", [old["command"]] if "command" in old else [])
    return {**old, "machine_at_rows": run["machine"], "commands": [*commands, run["command"] + "  (rows)"],
            "quality": run["quality"] or old.get("quality", []), "rows": kept + run["rows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "sieve")
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=100, help="timed queries per row")
    parser.add_argument("--local-mode-queries", type=int, default=10,
                        help="timed and recall queries of the qdrant-local rows (pure Python: seconds per query at 100k)")
    parser.add_argument("--row-backends", nargs="+", default=["local", "qdrant-edge", "qdrant-local"],
                        choices=["local", "qdrant-edge", "qdrant-local"])
    parser.add_argument("--merge", action="store_true", help="keep what --out holds that this run does not measure")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--max-queries", type=int, help="quality on a seeded sample of the judged test queries")
    parser.add_argument("--backends", nargs="+", default=["local", "qdrant"], choices=["local", "qdrant", "qdrant-edge"],
                        help="quality: the backends to run (qdrant: the client's local mode)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/qdrant.json"))
    args = parser.parse_args()
    biencoder = TextEncoder.from_pretrained(default_model_path(), name="all-MiniLM-L6-v2",
                                            lengths=EncoderLengths(64, 256))
    out = {"machine": machine(), "command": " ".join(sys.argv), "quality": [], "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    before = json.loads(args.out.read_text()) if args.merge and args.out.exists() else None

    def save(row: dict | None = None) -> None:
        out["rows"] += [row] if row else []
        args.out.write_text(json.dumps(merged(before, out), indent=1) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_quality:
            out["quality"] = quality(args.data, args.cache_dir, biencoder, Path(tmp), args.max_queries,
                                     args.backends)
            print(json.dumps(out["quality"], indent=1))
            save()
        corpus = read_beir_corpus(args.data / "corpus.jsonl")
        words = sorted({w for d in corpus[:2000] for w in d.full_text.lower().split() if w.isalpha()})
        queries = list(load_split(args.data, "test").queries.values())
        n_queries = {"local": args.queries, "qdrant-edge": args.queries, "qdrant-local": args.local_mode_queries}
        for n in args.sizes:
            size_rows(n, words, queries, biencoder, Path(tmp), n_queries, args.row_backends, save)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
