"""What exploration (SIEVE_FEEDBACK_EXPLORE_FRACTION, sieve/service/feedback_service.py) adds to a /search request,
timed alone: the draw every request makes (`pick_explore`, at fraction 0: the feature off, and at 0.2), and for an
exploring answer `explored` (the deeper candidates drawn from the served ranking of 512, their hits built and put
in place), on a 10-result answer. Not counted here: an exploring answer is computed, not read from the result cache
(one full search where the cache would have answered).

    .venv/bin/python benchmarks/explore_cost.py --out benchmarks/results/explore_cost_s6.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import sieve.stages  # noqa: E402,F401 (registers the stages whose score columns the candidates hold)

from benchmarks.click_memory_cost import Ids  # noqa: E402
from sieve.pipeline.candidates import Candidates  # noqa: E402
from sieve.service import schemas  # noqa: E402
from sieve.service.feedback_service import FeedbackService  # noqa: E402


def timed(fn, repeat: int) -> float:
    """Median microseconds per call over 7 blocks (the host is shared)."""
    fn()
    blocks = []
    for _ in range(7):
        began = time.perf_counter()
        for _ in range(repeat // 7):
            fn()
        blocks.append((time.perf_counter() - began) / (repeat // 7) * 1e6)
    return round(float(np.median(blocks)), 2)


def main() -> None:
    from sieve.evaluation.report import machine_info

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = args.candidates
    cands = Candidates(np.arange(n), {"retrieve": np.sort(rng.normal(size=n))[::-1].astype(np.float32),
                                      "cmc": np.sort(rng.normal(size=n))[::-1].astype(np.float32)})
    index = Ids([f"doc-{i}" for i in range(n)])
    hits = [schemas.SearchHit.model_construct(id=f"doc-{i}", rank=i + 1, score=float(cands.scores["cmc"][i]),
                                              scores={"retrieve": float(cands.scores["retrieve"][i]),
                                                      "cmc": float(cands.scores["cmc"][i])}, document=None)
            for i in range(args.top_k)]
    response = schemas.SearchResponse.model_construct(results=hits, timings_ms={}, index_version=1, stages=[],
                                                      warnings=[], partial=False, skipped=[], request_id="r")
    outcome = SimpleNamespace(state=SimpleNamespace(candidates=cands), index=index)
    service = SimpleNamespace(explore_fraction=0.0, explore_depth=args.depth, explore_slots=args.slots,
                              rng=random.Random(0))
    out = {"candidates": n, "top_k": args.top_k, "depth": args.depth, "slots": args.slots, "machine": machine_info(),
           "load_before": os.getloadavg(), "us_per_request": {}}
    out["us_per_request"]["pick_explore, fraction 0 (off)"] = timed(lambda: FeedbackService.pick_explore(service),
                                                                    args.repeat)
    service.explore_fraction = 0.2
    out["us_per_request"]["pick_explore, fraction 0.2"] = timed(lambda: FeedbackService.pick_explore(service),
                                                                args.repeat)
    out["us_per_request"]["explored (an exploring answer)"] = timed(
        lambda: FeedbackService.explored(service, response, outcome), args.repeat // 4)
    out["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["us_per_request"]), out["load_before"], out["load_after"])


if __name__ == "__main__":
    main()
