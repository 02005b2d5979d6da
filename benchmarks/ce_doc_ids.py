"""Documents tokenized for a model: process CPU per 100 SciFact abstracts (title + text) of the cross-encoder's
document token ids (`ce_tokens.document_ids` at its 128 tokens: what a /rerank of texts with the cross-encoder
tokenizes) or, with `--model be`, of the bi-encoder's padded batch (`TextEncoder.tokenize` at 256: the index build's
and a /rerank with CMC). Run it against two checkouts alternately (PYTHONPATH=TREE) to compare them; prints one JSON
line.

    PYTHONPATH=. python benchmarks/ce_doc_ids.py --label this [--model be]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import sieve
from sieve.models import ce_tokens
from sieve.models.cross_encoder import CrossEncoder
from sieve.models.text_encoder import TextEncoder
from sieve.models.weights import default_model_path

SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "data" / "scifact" / "corpus.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=SCIFACT)
    parser.add_argument("--label", default="this")
    parser.add_argument("--model", choices=["ce", "be"], default="ce")
    parser.add_argument("--max-length", type=int, help="default: 128 (the shipped cross-encoder), 256 (be documents)")
    parser.add_argument("--batches", type=int, default=50, help="batches of 100 documents")
    args = parser.parse_args()
    length = args.max_length or (128 if args.model == "ce" else 256)
    if args.model == "ce":
        ce = CrossEncoder.from_pretrained(str(Path(sieve.__file__).parent / "checkpoints" / "cross-encoder"))
        tokenize = lambda batch: ce_tokens.document_ids(ce.tokenizer, batch, length)  # noqa: E731
    else:
        encoder = TextEncoder.from_pretrained(default_model_path(), name="all-MiniLM-L6-v2")
        tokenize = lambda batch: encoder.tokenize(batch, length)  # noqa: E731
    docs = [json.loads(line) for line in args.corpus.open()]
    texts = [(d.get("title", "") + " " + d["text"]) for d in docs]
    batches = [texts[i * 100:(i + 1) * 100] for i in range(args.batches)]
    for batch in batches[:3]:
        tokenize(batch)
    started = time.process_time()
    for batch in batches:
        tokenize(batch)
    ms = (time.process_time() - started) / len(batches) * 1000
    print(json.dumps({"tree": args.label, "cpu_ms_per_100_documents": round(ms, 2), "model": args.model, "max_length": length}))


if __name__ == "__main__":
    main()
