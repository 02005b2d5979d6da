"""A design split for a collection whose only splits are train and test (SciFact): a data folder outside the
repository whose `train` qrels are most of the collection's train queries and whose `test` qrels are the rest (a
stable hash of the query id: the same queries every time), so the feedback benchmarks (feedback_sim.py,
feedback_memory_offline.py) can be designed on queries no click came from without touching the real test split.
The corpus and queries are linked, not copied.

    .venv/bin/python benchmarks/dev_split.py --data ../shared/data/scifact --out /tmp/scifact-dev
    .venv/bin/python benchmarks/feedback_sim.py --data /tmp/scifact-dev --index <a SciFact index> ...
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sieve.training.memory_learn import bucket  # noqa: E402 (the learner's stable hash of a key into [0, 1))


def is_dev(query_id: str, share: float) -> bool:
    return bucket(f"dev/{query_id}") < share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a collection with qrels/train.tsv")
    ap.add_argument("--out", type=Path, required=True, help="the new data folder (outside the repository)")
    ap.add_argument("--share", type=float, default=0.2, help="share of the train queries that become its test")
    args = ap.parse_args()
    (args.out / "qrels").mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        link = args.out / name
        if not link.exists():
            link.symlink_to((args.data / name).resolve())
    with open(args.data / "qrels" / "train.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header, rows = rows[0], rows[1:]
    for name, keep in (("train", False), ("test", True)):
        with open(args.out / "qrels" / f"{name}.tsv", "w", newline="") as f:
            out = csv.writer(f, delimiter="\t", lineterminator="\n")
            out.writerow(header)
            out.writerows(r for r in rows if is_dev(r[0], args.share) == keep)
    queries = {keep: len({r[0] for r in rows if is_dev(r[0], args.share) == keep}) for keep in (False, True)}
    print(f"{args.out}: train {queries[False]} queries, test (dev) {queries[True]}")


if __name__ == "__main__":
    main()
