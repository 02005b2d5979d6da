"""The cross-encoder's document token ids for caller texts (what a /rerank of texts tokenizes): process CPU of
`ce_tokens.document_ids` per 100 SciFact abstracts (title + text) at the shipped cross-encoder's max_length. Run it
against two checkouts alternately (PYTHONPATH=TREE) to compare them; prints one JSON line.

    PYTHONPATH=. python benchmarks/ce_doc_ids.py --label this
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import sieve
from sieve.models import ce_tokens
from sieve.models.cross_encoder import CrossEncoder

SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "data" / "scifact" / "corpus.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=SCIFACT)
    parser.add_argument("--label", default="this")
    parser.add_argument("--max-length", type=int, default=128, help="the shipped cross-encoder reads 128")
    parser.add_argument("--batches", type=int, default=50, help="batches of 100 documents")
    args = parser.parse_args()
    ce = CrossEncoder.from_pretrained(str(Path(sieve.__file__).parent / "checkpoints" / "cross-encoder"))
    docs = [json.loads(line) for line in args.corpus.open()]
    texts = [(d.get("title", "") + " " + d["text"]) for d in docs]
    batches = [texts[i * 100:(i + 1) * 100] for i in range(args.batches)]
    for batch in batches[:3]:
        ce_tokens.document_ids(ce.tokenizer, batch, args.max_length)
    started = time.process_time()
    for batch in batches:
        ce_tokens.document_ids(ce.tokenizer, batch, args.max_length)
    ms = (time.process_time() - started) / len(batches) * 1000
    print(json.dumps({"tree": args.label, "cpu_ms_per_100_documents": round(ms, 2), "max_length": args.max_length}))


if __name__ == "__main__":
    main()
