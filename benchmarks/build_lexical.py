"""What `sieve index build` spends outside the model on a large corpus, and what tokenizing the BM25 part in several
processes while the documents are encoded saves (issue 32: index build >= 10,000 documents/s on a GPU, where the
H200 machine's build of SciFact x 9 took 35.3 s, benchmarks/results/gpu_nvidia_h200.json).

The encoder is a stand-in (a seeded unit vector per document, no model), so what is timed is everything else a build
does: reading, BM25 tokenizing, postings, FAISS, SQLite, fsync. `--encode-s` makes the stand-in take that long
without using the CPU (a sleep), as a GPU's encoding leaves the CPU free: the H200's took 17 s of the 35. Sides,
interleaved by round (order reversed every other round), each a fresh build in a temporary directory:

- `one`: the BM25 part tokenized in this process after the encoding (lexical_processes=1, as before);
- `procs`: in lexical.build_processes(N) processes started before the encoding (what `sieve index build` does now).

    python benchmarks/build_lexical.py --copies 9 --rounds 3 --out benchmarks/results/build_lexical_zen4.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sieve.evaluation.report import machine_info  # noqa: E402
from sieve.index import Document, build_index, read_beir_corpus  # noqa: E402
from sieve.index.lexical import build_processes  # noqa: E402


class StandIn:
    """A DocumentEncoder with no model: seeded unit vectors, `seconds` of sleep per call (a device at work)."""
    name, weights_hash, dim, max_length = "stand-in", "0" * 64, 384, 256

    def __init__(self, seconds: float):
        self.seconds = seconds

    def encode_documents(self, texts, progress: bool = True) -> np.ndarray:
        time.sleep(self.seconds)
        vectors = np.random.default_rng(len(texts)).standard_normal((len(texts), self.dim), dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared/data/scifact/corpus.jsonl")
    parser.add_argument("--copies", type=int, default=9, help="the corpus this many times over (ids made unique)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--encode-s", type=float, default=0.0, help="the stand-in encoder's sleep, in seconds")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    base = list(read_beir_corpus(args.corpus))
    docs = [Document(f"{d.id}#{c}", d.title, d.text) for c in range(args.copies) for d in base]
    sides = {"one": 1, "procs": build_processes(len(docs))}
    times: dict[str, list[float]] = {side: [] for side in sides}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as out:
                start = time.perf_counter()
                build_index(docs, StandIn(args.encode_s), Path(out) / "idx", progress=False,
                            lexical_processes=sides[side])
                times[side].append(time.perf_counter() - start)
            print(f"round {r} {side:>5} ({sides[side]} process(es)): {times[side][-1]:.2f} s", flush=True)
        load.append(os.getloadavg()[0])
    median = {side: statistics.median(t) for side, t in times.items()}
    print(f"\n| side | processes | median s | docs/s | rounds |\n|---|---:|---:|---:|---|")
    for side, n in sides.items():
        print(f"| {side} | {n} | {median[side]:.2f} | {len(docs) / median[side]:,.0f} | "
              f"{', '.join(f'{t:.2f}' for t in times[side])} |")
    ratio = median["one"] / median["procs"]
    print(f"\nprocs is {ratio:.2f}x one ({len(docs):,} documents, stand-in encoder sleeping {args.encode_s} s)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "what": "sieve index build outside the model: BM25 tokenized in one process after encoding against "
                    "several processes during it (benchmarks/build_lexical.py)",
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "documents": len(docs),
            "encode_s": args.encode_s, "processes": sides, "seconds": times, "median_s": median,
            "docs_per_s": {side: len(docs) / m for side, m in median.items()}, "speedup": ratio,
            "load_avg_1m": load, "machine": machine_info()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
