"""Which BM25 engine for the lexical stage: bm25s (sparse matrices, in the index version) vs tantivy (inverted
index with segments and deletes), on one BEIR test split, side by side in one run.

Per engine: build time over the whole corpus (title + text), query p50 / p95 over the judged test queries (top 100),
nDCG@10 and Recall@100, and the cost of a one-document write the way Sieve would do it (bm25s: a version rebuilds
the lexical part from its documents; tantivy: add + commit into the existing index). Queries are timed in
interleaved blocks (engine A, engine B, A, B, ...) so machine noise hits both alike. Usage:
  python benchmarks/lexical_engines.py --data ../shared/data/scifact --out benchmarks/results/lexical_engines.json
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cmc_latency import machine  # noqa: E402
from sieve.evaluation.dataset import load_split  # noqa: E402
from sieve.evaluation.summary import quality  # noqa: E402
from sieve.index import Document, read_beir_corpus  # noqa: E402
from sieve.index.lexical import LexicalConfig, LexicalIndex, write_lexical  # noqa: E402


class Bm25s:
    name = "bm25s"

    def __init__(self, docs: list[Document], workdir: Path):
        self.docs, self.workdir = docs, workdir
        self.config = LexicalConfig()

    def build(self) -> None:
        (self.workdir / "bm25s").mkdir(parents=True, exist_ok=True)
        write_lexical(self.workdir / "bm25s", self.docs, self.config)
        self.index = LexicalIndex(self.workdir / "bm25s", self.config, len(self.docs))

    def search(self, query: str, k: int) -> list[str]:
        _, rows = self.index.search(query, k)
        return [self.docs[r].id for r in rows]

    def write_one(self, doc: Document) -> None:
        """What a Sieve version does: the lexical part is rebuilt from the version's documents."""
        target = self.workdir / f"bm25s-{doc.id}"
        target.mkdir()
        write_lexical(target, [*self.docs, doc], self.config)


class Tantivy:
    name = "tantivy"

    def __init__(self, docs: list[Document], workdir: Path):
        self.docs, self.workdir = docs, workdir

    def build(self) -> None:
        import tantivy

        builder = tantivy.SchemaBuilder()
        builder.add_text_field("id", stored=True, tokenizer_name="raw")
        builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
        self.schema = builder.build()
        (self.workdir / "tantivy").mkdir(parents=True, exist_ok=True)
        self.index = tantivy.Index(self.schema, path=str(self.workdir / "tantivy"))
        writer = self.index.writer(num_threads=1)
        for d in self.docs:
            writer.add_document(tantivy.Document(id=d.id, body=d.full_text))
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        self.searcher = self.index.searcher()

    def search(self, query: str, k: int) -> list[str]:
        words = re.findall(r"\w+", query.lower())  # the query parser would read + - : ( ) as syntax
        if not words:
            return []
        parsed = self.index.parse_query(" ".join(words), ["body"])
        return [self.searcher.doc(address)["id"][0] for _, address in self.searcher.search(parsed, k).hits]

    def write_one(self, doc: Document) -> None:
        import tantivy

        writer = self.index.writer(num_threads=1)
        writer.add_document(tantivy.Document(id=doc.id, body=doc.full_text))
        writer.commit()
        writer.wait_merging_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--blocks", type=int, default=5, help="interleaved timing blocks per engine")
    parser.add_argument("--writes", type=int, default=5, help="one-document writes timed per engine")
    args = parser.parse_args()
    docs = read_beir_corpus(args.data / "corpus.jsonl")
    data = load_split(args.data, "test")
    with tempfile.TemporaryDirectory() as tmp:
        engines = [Bm25s(docs, Path(tmp)), Tantivy(docs, Path(tmp))]
        rows = {}
        for engine in engines:
            started = time.perf_counter()
            engine.build()
            rows[engine.name] = {"engine": engine.name, "build_s": round(time.perf_counter() - started, 3)}
        times = {e.name: [] for e in engines}
        rankings = {e.name: {} for e in engines}
        queries = list(data.queries.items())
        for _ in range(args.blocks):
            for engine in engines:
                for qid, text in queries:
                    started = time.perf_counter()
                    rankings[engine.name][qid] = engine.search(text, 100)
                    times[engine.name].append((time.perf_counter() - started) * 1000)
        for engine in engines:
            write_ms = []
            for i in range(args.writes):
                started = time.perf_counter()
                engine.write_one(Document(f"bench-new-{i}", "", "a freshly written document about volcano ash"))
                write_ms.append((time.perf_counter() - started) * 1000)
            q = quality(rankings[engine.name], data.qrels)
            rows[engine.name].update({"query_ms_p50": round(float(np.percentile(times[engine.name], 50)), 3),
                                      "query_ms_p95": round(float(np.percentile(times[engine.name], 95)), 3),
                                      "ndcg@10": round(q["ndcg@10"], 4), "recall@100": round(q["recall@100"], 4),
                                      "write_1_doc_ms_p50": round(float(np.median(write_ms)), 1)})
    print("| engine | build s | query p50 ms | query p95 ms | nDCG@10 | Recall@100 | 1-doc write ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows.values():
        print(f"| {r['engine']} | {r['build_s']} | {r['query_ms_p50']} | {r['query_ms_p95']} | {r['ndcg@10']} | "
              f"{r['recall@100']} | {r['write_1_doc_ms_p50']} |")
    if args.out:
        doc = {"dataset": data.name, "split": "test", "queries": len(queries), "docs": len(docs),
               "machine": machine(),
               "settings": {"bm25s": "lucene BM25 k1 1.5 b 0.75, english stop words + PyStemmer english",
                            "tantivy": "BM25 (k1 1.2, b 0.75 built in), en_stem tokenizer (no stop words), "
                                       "query = its words OR-ed"},
               "command": " ".join(["python", *sys.argv]), "rows": list(rows.values())}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
