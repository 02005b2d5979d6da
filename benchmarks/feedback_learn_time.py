"""How long `sieve feedback learn` takes on a large log (issue 33 target: 100,000 events in <= 10 minutes on 2 cores).

Writes a click log of --answers answers (train-split queries of a BEIR dataset; clicks from a position-based model,
examination (1/r)^1, p+ 0.9, p- 0.05) on 10 shown ids: with `--shown ranked` (the default) the index's own BM25 top
10 for the query, a ranking as a server shows one; with `--shown random` (the only log before the thirty-third
session) up to 3 relevant among random others, shuffled, where the cross-fitted guard refuses the memory and so the
refit that follows a guard that passes (`--memory-publish refit`, the default) is never timed. Loads it with `sieve
feedback import` into a copy of the index, then runs `sieve feedback learn --dry-run` on it. Records each command's
wall time, CPU time and peak memory, and the learner's report.

    .venv/bin/python benchmarks/feedback_learn_time.py --index /tmp/fb/scifact --data ../shared/data/scifact \
        --answers 240000 --out benchmarks/results/feedback_learn_time.json
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sieve.evaluation.report import machine_info  # noqa: E402


def ranked_lists(index: Path, queries: dict[str, str], qids: list[str], k: int = 10) -> dict[str, list[str]]:
    """Each query's top k by the index's BM25 (what `--shown ranked` shows)."""
    from sieve.index import SearchIndex

    with SearchIndex.load(index) as loaded:
        out = {}
        for q in qids:
            _, rows = loaded.search_lexical(queries[q], k)
            out[q] = [d.id for d in loaded.documents([int(r) for r in rows])]
        return out


def click_log(data: Path, answers: int, out: Path, seed: int = 0, index: Path | None = None) -> int:
    """Writes the log; returns the number of clicks in it. With `index`, each answer shows the index's BM25 top 10
    for its query (`--shown ranked`), else up to 3 relevant documents among random others, shuffled."""
    rng = random.Random(seed)
    queries = {q["_id"]: q["text"] for q in map(json.loads, open(data / "queries.jsonl", encoding="utf-8"))}
    docs = [json.loads(line)["_id"] for line in open(data / "corpus.jsonl", encoding="utf-8")]
    relevant: dict[str, set[str]] = {}
    with open(data / "qrels" / "train.tsv", encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            if int(row["score"]) > 0:
                relevant.setdefault(row["query-id"], set()).add(row["corpus-id"])
    qids = sorted(q for q in relevant if q in queries)
    ranked = ranked_lists(index, queries, qids) if index is not None else None
    clicks = 0
    with open(out, "w", encoding="utf-8") as handle:
        for _ in range(answers):
            q = rng.choice(qids)
            if ranked is not None:
                shown = ranked[q]
            else:
                shown = list(dict.fromkeys(sorted(relevant[q])[:3] + rng.sample(docs, 10)))[:10]
                rng.shuffle(shown)
            clicked = [d for r, d in enumerate(shown, 1)
                       if rng.random() < 1 / r and rng.random() < (0.9 if d in relevant[q] else 0.05)]
            clicks += len(clicked)
            handle.write(json.dumps({"query": queries[q], "shown": shown, "clicked": clicked}) + "\n")
    return clicks


def timed(command: list[str], log: Path) -> dict:
    """Runs `command` (output to `log`); its wall and CPU seconds and peak memory, from wait4."""
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return {"command": " ".join(command), "exit": os.waitstatus_to_exitcode(status), "wall_s": round(wall, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024),
            "output_tail": log.read_text(encoding="utf-8")[-3000:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", type=Path, required=True, help="a local index of --data's corpus (copied, not changed)")
    ap.add_argument("--data", type=Path, required=True, help="BEIR dataset folder with qrels/train.tsv")
    ap.add_argument("--answers", type=int, default=240_000, help="answers in the log (SciFact's random lists: ~0.43 "
                    "clicks each; NFCorpus's ranked lists: ~0.92, 58%% of answers clicked)")
    ap.add_argument("--shown", choices=["ranked", "random"], default="ranked", help="what each answer shows: the "
                    "index's BM25 top 10 (ranked) or up to 3 relevant documents among random ones, shuffled")
    ap.add_argument("--learn-args", default="", help="more options of `sieve feedback learn` (e.g. "
                    "'--memory-guard crossfit')")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sieve = str(Path(sys.executable).with_name("sieve"))
    with tempfile.TemporaryDirectory(prefix="sieve-learn-time-") as tmp:
        work = Path(tmp)
        index = work / "index"
        shutil.copytree(args.index, index, ignore=shutil.ignore_patterns("feedback", "adapted"))
        clicks = click_log(args.data, args.answers, work / "clicks.jsonl",
                           index=args.index if args.shown == "ranked" else None)
        print(f"{args.answers} answers, {clicks} clicks", flush=True)
        imported = timed([sieve, "feedback", "import", str(work / "clicks.jsonl"), "--index", str(index)],
                         work / "import.log")
        learned = timed([sieve, "feedback", "learn", "--index", str(index), "--dry-run", *shlex.split(args.learn_args)],
                        work / "learn.log")
        log_mb = sum(p.stat().st_size for p in (index / "feedback").iterdir()) / 2**20
    report = {"answers": args.answers, "clicks": clicks, "shown": args.shown, "feedback_log_mb": round(log_mb),
              "import": imported, "learn": learned, "load_average_after": os.getloadavg(), "machine": machine_info(),
              "command": " ".join(sys.argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"| step | wall s | CPU s | peak MB |\n|---|---:|---:|---:|")
    for name, run in (("import", imported), ("learn", learned)):
        print(f"| {name} | {run['wall_s']} | {run['cpu_s']} | {run['peak_rss_mb']} |")


if __name__ == "__main__":
    main()
