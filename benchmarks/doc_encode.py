"""How fast the bi-encoder encodes documents (what `sieve index build`, `sieve index add` and live writes spend most of
their time on), and how far the lowered document tower's vectors are from fp32's (issue 32: index build >= 10,000
documents/s on a GPU; SIEVE_DOC_PRECISION).

Sides, interleaved by round (order reversed every other round), each encoding the same documents (SciFact title +
abstract, the first --docs, at the encoder's 256 tokens, batches of SIEVE_ENCODE_BATCH_SIZE):

- `serial`: fp32, each batch tokenized then encoded in turn (the encoder before this session);
- `fp32`: fp32, each next batch tokenized in a thread while the current one is encoded (TextEncoder.encode now);
- `auto`: the document tower SIEVE_DOC_PRECISION=auto picks on this device (precision_stages.lower_document_tower:
  bf16 on a CPU with native bf16, fp16 on CUDA, guarded), tokenized ahead as `fp32`;
- `tokenize`: the tokenizing alone, no model: the documents per second the rest of the encoder allows (its
  ceiling, what a device whose forwards cost nothing would leave).

Prints a table; writes JSON with the machine (CPU flags), each round's documents per second, and the lowered
vectors' cosine with fp32's (min, mean) and how often each document's nearest probe query changes.

    python benchmarks/doc_encode.py --docs 1024 --rounds 3 --out benchmarks/results/doc_encode_zen5_s40.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sieve.evaluation.report import machine_info  # noqa: E402
from sieve.models.device import pick_device  # noqa: E402
from sieve.models.precision_stages import lower_document_tower  # noqa: E402
from sieve.service.components import load_biencoder  # noqa: E402
from sieve.service.config import Settings  # noqa: E402

SCIFACT = REPO.parent / "shared" / "data" / "scifact" / "corpus.jsonl"
SIDES = ("serial", "fp32", "auto", "tokenize")


def serial_encode(encoder, texts: list[str]) -> np.ndarray:
    """TextEncoder.encode as it was: tokenize a batch, encode it, the next."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    out = np.empty((len(texts), encoder.dim), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(texts), encoder.batch_size):
            idx = order[start:start + encoder.batch_size]
            batch = encoder.tokenize([texts[i] for i in idx], encoder.lengths.doc_max_length)
            out[idx] = encoder.module(**batch).float().cpu().numpy()
    return out


def tokenize_only(encoder, texts: list[str]) -> None:
    order = np.argsort([-len(t) for t in texts], kind="stable")
    for start in range(0, len(texts), encoder.batch_size):
        encoder.tokenize([texts[i] for i in order[start:start + encoder.batch_size]], encoder.lengths.doc_max_length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=SCIFACT)
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sides = args.sides.split(",")
    settings = Settings()
    device = pick_device(settings.device)
    encoder = load_biencoder(settings, device)
    rows = [json.loads(line) for line, _ in zip(args.corpus.open(), range(args.docs))]
    texts = [(r.get("title", "") + " " + r["text"]).strip() for r in rows]
    started = time.perf_counter()
    lowered, choice = lower_document_tower(encoder, "auto")
    guard_s = time.perf_counter() - started
    run = {
        "serial": lambda: serial_encode(encoder, texts),
        "fp32": lambda: encoder.encode(texts, encoder.lengths.doc_max_length),
        "auto": lambda: encoder.encode(texts, encoder.lengths.doc_max_length, module=lowered),
        "tokenize": lambda: tokenize_only(encoder, texts),
    }
    for side in sides:  # warm-up: kernels chosen, pages in
        run[side]() if side == "tokenize" else encoder.encode(texts[:encoder.batch_size], 256, module=lowered if side == "auto" else None)
    per_round: dict[str, list[float]] = {side: [] for side in sides}
    vectors: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = run[side]()
            seconds = time.perf_counter() - t0
            per_round[side].append(round(len(texts) / seconds, 1))
            if out is not None:
                vectors[side] = out
            print(f"round {r} {side:>8}: {len(texts) / seconds:9.1f} documents/s ({seconds:.2f} s)", flush=True)
    result = {"what": "documents encoded per second by the bi-encoder (SciFact title + abstract, 256 tokens)",
              "command": " ".join(sys.argv), "machine": machine_info(), "device": str(device),
              "documents": len(texts), "batch_size": encoder.batch_size,
              "document_tower": {**choice.as_dict(), "guard_seconds": round(guard_s, 2)},
              "docs_per_s": per_round,
              "median_docs_per_s": {side: statistics.median(v) for side, v in per_round.items()}}
    base = result["median_docs_per_s"].get("serial")
    if base:
        result["ratio_over_serial"] = {side: round(v / base, 3) for side, v in result["median_docs_per_s"].items()}
    if "fp32" in vectors and "serial" in vectors:
        result["fp32_max_abs_diff_from_serial"] = float(np.abs(vectors["fp32"] - vectors["serial"]).max())
    if "fp32" in vectors and "auto" in vectors:
        ref, low = vectors["fp32"], vectors["auto"]
        cosine = (ref * low).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(low, axis=1)
        result["auto_vs_fp32"] = {"cosine_min": float(cosine.min()), "cosine_mean": float(cosine.mean()),
                                  "top1_agreement_over_documents_as_queries": float(np.mean(
                                      np.argsort(-(ref @ ref.T), axis=1)[:, 1] == np.argsort(-(low @ low.T), axis=1)[:, 1]))}
    print("\n| side | documents/s (median of rounds) | x serial |\n|---|---:|---:|")
    for side in sides:
        print(f"| {side} | {result['median_docs_per_s'][side]:.1f} | {result.get('ratio_over_serial', {}).get(side, '')} |")
    print(json.dumps({k: result[k] for k in ("document_tower", "auto_vs_fp32") if k in result}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
