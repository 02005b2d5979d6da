"""The CPU cost of laying out a /rerank's (query, document) pairs for the shipped cross-encoder (the gated head), the
work that stays on the CPU however fast the GPU is: on an NVIDIA H200 the `ce` stage of a /rerank of 100 took 93 ms
where the forward takes 3.3 ms (benchmarks/results/gpu_nvidia_h200.json).

Compares, interleaved, the current CrossEncoderRerank.pair_batch with the code it replaced (copied here, `before`):
documents tokenized whole up to clip_all's bound, the query tokenized once per document, one torch.tensor per row.
Both give the same tensors (checked every round); SciFact abstracts, 100 per call, one query.

    python benchmarks/ce_pairs.py [--rounds 6] [--out benchmarks/results/ce_pairs.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sieve import checkpoints  # noqa: E402
from sieve.models import ce_gated, ce_tokens  # noqa: E402
from sieve.models.ce_heads import trained_lengths  # noqa: E402
from sieve.models.clip import clip_all  # noqa: E402
from sieve.models.cross_encoder import CrossEncoder, PairLengths  # noqa: E402
from sieve.pipeline.stages import CrossEncoderRerank  # noqa: E402

QUERY = "what happens when a star runs out of hydrogen"


def before_document_ids(tokenizer, documents, max_length):
    return tokenizer(clip_all(documents, max_length), add_special_tokens=False, truncation=True,
                     max_length=max_length)["input_ids"]


def before_query_ids(tokenizer, queries, query_max_length):
    return tokenizer(clip_all(queries, query_max_length), add_special_tokens=False, truncation=True,
                     max_length=query_max_length)["input_ids"]


def before_pair_inputs(tokenizer, query_ids, doc_ids, max_length):
    cls_id, sep_id, pad_id = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    rows, segs = [], []
    for q, d in zip(query_ids, doc_ids):
        query = [cls_id, *q[:max(0, max_length - 6)], sep_id]
        doc = [cls_id, *d[:max(0, max_length - len(query) - 2)], sep_id]
        rows.append(query + doc)
        segs.append([0] * len(query) + [1] * len(doc))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    segments = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, s) in enumerate(zip(rows, segs)):
        ids[i, :len(r)], segments[i, :len(s)], mask[i, :len(r)] = torch.tensor(r), torch.tensor(s), 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


NOW = (ce_tokens.document_ids, ce_tokens.query_ids, ce_gated.GatedScorer.pair_inputs)
BEFORE = (before_document_ids, before_query_ids, before_pair_inputs)


def use(functions) -> None:
    ce_tokens.document_ids, ce_tokens.query_ids, pair_inputs = functions
    ce_gated.GatedScorer.pair_inputs = staticmethod(pair_inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "data" / "scifact" / "corpus.jsonl")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=5, help="calls of 100 documents per side per round")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "ce_pairs.json")
    args = parser.parse_args()
    path = Path(checkpoints.CROSS_ENCODER)
    ce = CrossEncoder.from_pretrained(path, lengths=trained_lengths(path))  # as served: the lengths it was trained at
    rows = [json.loads(line) for line, _ in zip(open(args.corpus), range(100 * args.calls * args.rounds))]
    texts = [(r.get("title", "") + " " + r["text"]).strip() for r in rows]
    stage = CrossEncoderRerank(ce, None, 100)
    ms = {"before": [], "now": []}
    for rnd in range(args.rounds):
        for side, functions in (("before", BEFORE), ("now", NOW)):
            use(functions)
            for i in range(args.calls):
                start = 100 * (rnd * args.calls + i)
                t = time.perf_counter()
                stage.pair_batch([(QUERY, texts[start:start + 100], None)])
                ms[side].append(1000 * (time.perf_counter() - t))
        sample = [(QUERY, texts[100 * rnd:100 * rnd + 100], None)]
        use(BEFORE)
        a = stage.pair_batch(sample)
        use(NOW)
        b = stage.pair_batch(sample)
        assert all(torch.equal(a[k], b[k]) for k in a), "the pairs differ"
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    result = {"what": "ms of CPU wall time to lay out the pairs of one /rerank of 100 SciFact abstracts (gated head, "
                      "max_length " + str(ce.lengths.max_length) + ")",
              "machine": {"cpu": platform.processor() or next((line.split(":", 1)[1].strip() for line in
                                                                open("/proc/cpuinfo") if line.startswith("model name")),
                                                               None),
                          "cores": os.cpu_count(),
                          "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx"))),
                          "load_avg": list(os.getloadavg())},
              "before_ms_median": round(statistics.median(ms["before"]), 2),
              "now_ms_median": round(statistics.median(ms["now"]), 2), "samples": ms}
    result["now_over_before"] = round(result["now_ms_median"] / result["before_ms_median"], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| side | median ms per 100 pairs | calls |\n|---|---:|---:|")
    for side in ms:
        print(f"| {side} | {result[side + '_ms_median']} | {len(ms[side])} |")
    print(f"now / before: {result['now_over_before']}  (same tensors in every round) -> {args.out}")


if __name__ == "__main__":
    main()
