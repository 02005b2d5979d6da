"""CPU a cross-encoder's pairs cost before any forward, per /rerank of `--docs` SciFact abstracts: the stage's
prepare (in the request's thread) plus pair_batch (in the batcher), for requests alone and in batches of
`--batch`, with the shipped cross-encoder's tokenizer and pair layout (no forward). Each tree (a baseline checkout
and this one) runs in its own process, blocks interleaved, the order reversed every other round; CPU is the
process's own (time.process_time), so other work on the host counts little.

    python benchmarks/ce_layout_cpu.py --baseline-tree /work/base --out benchmarks/results/ce_layout_cpu_<host>.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(data: Path, docs: int, batch: int, requests: int, threads: int) -> dict:
    """In the tree on sys.path: CPU ms per request of prepare + pair_batch, alone, `batch` at a time, and each
    request alone but `threads` of them at once in their own threads (wall ms per request: the tokenizer's lock,
    or none)."""
    import numpy as np

    from sieve import checkpoints
    from sieve.models.ce_heads import trained_lengths
    from sieve.models.cross_encoder import CrossEncoder
    from sieve.pipeline.candidates import Candidates
    from sieve.pipeline.stages import CrossEncoderRerank
    from sieve.pipeline.state import Deadline, QueryState
    from sieve.pipeline.threadsafe import TokenizerLocks

    ce = TokenizerLocks().locked(CrossEncoder.from_pretrained(
        checkpoints.CROSS_ENCODER, lengths=trained_lengths(checkpoints.CROSS_ENCODER)))  # as serving holds it
    corpus = [json.loads(line) for _, line in zip(range(3000), (data / "corpus.jsonl").open())]
    texts = [f"{d.get('title', '')}\n{d['text']}".strip() for d in corpus]
    queries = [json.loads(line)["text"] for line in (data / "queries.jsonl").open()]
    stage = CrossEncoderRerank(ce, None, docs)

    def state(j: int) -> QueryState:
        s = QueryState(queries[j % len(queries)])
        s.deadline = Deadline(None, None)
        s.candidates = Candidates(rows=np.full(docs, -1), texts=[texts[(j * 101 + i * 7) % len(texts)] for i in range(docs)],
                                  scores={"retrieve": -np.arange(docs, dtype=np.float32)})
        return s

    out = {}
    for name, size in (("alone", 1), (f"batch{batch}", batch)):
        stage.pair_batch([stage.prepare(state(0))])  # warm
        cpu, wall = time.process_time(), time.perf_counter()
        for j in range(0, requests, size):
            stage.pair_batch([stage.prepare(state(j + i)) for i in range(size)])
        out[name] = {"cpu_ms_per_request": round(1000 * (time.process_time() - cpu) / requests, 3),
                     "wall_ms_per_request": round(1000 * (time.perf_counter() - wall) / requests, 3)}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:  # requests laid out in `threads` threads at once (no batcher)
        list(pool.map(lambda j: stage.pair_batch([stage.prepare(state(j))]), range(threads)))  # warm
        cpu, wall = time.process_time(), time.perf_counter()
        list(pool.map(lambda j: stage.pair_batch([stage.prepare(state(j))]), range(requests)))
        out[f"threads{threads}"] = {"cpu_ms_per_request": round(1000 * (time.process_time() - cpu) / requests, 3),
                                    "wall_ms_per_request": round(1000 * (time.perf_counter() - wall) / requests, 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared/data/scifact")
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.data, args.docs, args.batch, args.requests, args.threads)))
        return

    from sieve.evaluation.report import machine_info

    trees = {"baseline": args.baseline_tree.resolve(), "this": REPO}
    rows = []
    for r in range(args.rounds):
        for side in (("baseline", "this") if r % 2 == 0 else ("this", "baseline")):
            env = {**os.environ, "PYTHONPATH": str(trees[side])}
            done = subprocess.run([sys.executable, __file__, "--child", "--data", str(args.data.resolve()),
                                   "--docs", str(args.docs), "--batch", str(args.batch), "--requests",
                                   str(args.requests), "--threads", str(args.threads), "--baseline-tree",
                                   str(trees["baseline"])],
                                  cwd=trees[side], env=env, capture_output=True, text=True, check=True)
            row = {"round": r, "side": side, **json.loads(done.stdout.strip().splitlines()[-1]),
                   "load_avg_1m": os.getloadavg()[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    print("\n| requests | measure | side | ms per /rerank by round | median |\n|---|---|---|---|---:|")
    for name in ("alone", f"batch{args.batch}", f"threads{args.threads}"):
        for measure_ in ("cpu_ms_per_request", "wall_ms_per_request"):
            key = f"{name}_{measure_.split('_')[0]}"
            for side in ("baseline", "this"):
                values = [row[name][measure_] for row in rows if row["side"] == side]
                summary[f"{side}_{key}"] = sorted(values)[len(values) // 2]
                print(f"| {name} | {measure_.split('_')[0]} | {side} | {', '.join(map(str, values))} | "
                      f"{summary[f'{side}_{key}']} |")
            summary[f"this_over_baseline_{key}"] = round(summary[f"this_{key}"] / summary[f"baseline_{key}"], 3)
            print(f"| {name} | {measure_.split('_')[0]} | this / baseline | | {summary[f'this_over_baseline_{key}']}x |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        sys.path.insert(0, str(REPO / "benchmarks"))
        import overhead

        args.out.write_text(json.dumps({
            "what": "CPU of a /rerank's cross-encoder pairs (prepare + pair_batch, no forward), per request",
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "docs": args.docs,
            "trees": {s: dict(zip(("commit", "changed"), overhead.tree_state(t))) for s, t in trees.items()},
            "rows": rows, "summary": summary, "machine": machine_info()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
