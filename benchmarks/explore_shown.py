"""What exploration (SIEVE_FEEDBACK_EXPLORE_FRACTION) showed in a feedback_sim.py run, from its logs: for exploring
and other /search answers, how many there were, their clicks per answer, and the nDCG@10 of what they showed by the
split's qrels (what the simulated users were given: the cost of exploring to them); and the relevant (query,
document) pairs the users were shown only in exploring answers (what exploring added to what clicks can count).

    .venv/bin/python benchmarks/explore_shown.py --index /tmp/nfx/nfcorpus-train-test/index \
        --data ../shared/data/nfcorpus --out benchmarks/results/explore_shown.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from sieve.evaluation.dataset import load_split  # noqa: E402
from sieve.evaluation.metrics import ndcg_at_k  # noqa: E402
from sieve.feedback.dataset import Logs  # noqa: E402
from sieve.feedback.records import query_key  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="a feedback_sim.py work index, its logs in feedback/")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--split", default="train", help="the split the sessions drew their queries from")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    data = load_split(args.data, args.split)
    qrels = {query_key(" ".join(text.split())): data.qrels[q] for q, text in data.queries.items()}
    logs = Logs.read(args.index / "feedback")
    clicks = logs.clicks()
    groups = {"exploring": [], "other": []}
    shown_by = {"exploring": set(), "other": set()}  # relevant (query, doc) pairs shown
    for rid, imp in logs.impressions.items():
        judged = qrels.get(imp["query_key"])
        if imp.get("endpoint") != "/search" or judged is None:
            continue
        group = "exploring" if imp.get("explore") else "other"
        groups[group].append((ndcg_at_k(imp["shown"], judged, 10), len(clicks.get(rid, ()))))
        shown_by[group] |= {(imp["query_key"], d) for d in imp["shown"] if judged.get(d, 0) > 0}
    out = {"command": " ".join(sys.argv), "answers": {}}
    for group, rows in groups.items():
        if rows:
            a = np.array(rows, dtype=np.float64)
            out["answers"][group] = {"answers": len(rows), "shown_ndcg@10": round(float(a[:, 0].mean()), 4),
                                     "clicks_per_answer": round(float(a[:, 1].mean()), 4)}
    out["relevant_pairs_shown"] = {"any answer": len(shown_by["exploring"] | shown_by["other"]),
                                   "only in exploring answers": len(shown_by["exploring"] - shown_by["other"])}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
