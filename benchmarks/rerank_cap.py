"""The /rerank work cap and deadline steps (issue 34) against a real `sieve serve` with the shipped models: how long
ordinary /rerank requests take with each reranker, how long one at the work cap takes, and by how much a request
at the cap overruns a short deadline (the last step that runs past it). Starts its own server from `--tree`
(default: this one) on the demo index, all traffic to 127.0.0.1, every loop bounded; every request sends
`Cache-Control: no-cache`. Passages are real text: SciFact abstracts cut at a word boundary to 300-500 characters
(seeded), queries SciFact test queries.
Cases, each for model cmc (the default) and ce:
  typical: 100 passages of 300-500 characters (the issue's "rerank my top 100"), default deadline;
  at_cap: as many such passages as fit under SIEVE_RERANK_MAX_TOKENS, default deadline;
  overrun: the at_cap request with timeout_ms 2000: seconds past the deadline.
Usage: python benchmarks/rerank_cap.py --out benchmarks/results/rerank_cap.json [--data ../shared/data/scifact]
       [--repeats 3] [--tree DIR]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cmc_latency import machine  # noqa: E402
from tests.server import REPO, Server  # noqa: E402

DEADLINE_S = 2.0


def passages(corpus: Path, n: int, seed: int) -> list[str]:
    """n texts of 300-500 characters, each the start of an abstract cut after a word."""
    rng = random.Random(seed)
    texts = [json.loads(line)["text"] for line in corpus.open()]
    texts = [t for t in texts if len(t) >= 500]
    out = []
    for text in rng.sample(texts, n):
        cut = text[:rng.randint(300, 500)]
        out.append(cut[:cut.rfind(" ")] if " " in cut[300:] else cut)
    return out


def queries(data: Path, n: int, seed: int) -> list[str]:
    rows = [json.loads(line)["text"] for line in (data / "queries.jsonl").open()]
    return random.Random(seed).sample(rows, n)


@functools.lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    from sieve.models.weights import default_model_path

    return AutoTokenizer.from_pretrained(str(default_model_path()))


def tokens_of(texts: list[str]) -> int:
    """What the cap counts for CMC (the candidate tower's tokens, cut at 256)."""
    from sieve.pipeline.rerank_inputs import token_lengths

    return sum(token_lengths(tokenizer(), texts, 256))


def timed(client: httpx.Client, body: dict) -> dict:
    started = time.perf_counter()
    reply = client.post("/rerank", json=body, headers={"Cache-Control": "no-cache"})
    seconds = time.perf_counter() - started
    out = {"status": reply.status_code, "seconds": round(seconds, 3)}
    if reply.status_code == 200:
        answer = reply.json()
        out |= {"partial": answer["partial"], "skipped": answer["skipped"],
                "server_ms": {k: round(v, 1) for k, v in answer["timings_ms"].items()}}
    else:
        out["error"] = reply.json()["error"]["code"]
    return out


def run(server: Server, docs: list[str], cap_docs: list[str], qs: list[str], repeats: int) -> dict:
    cases = {}
    with server.client(timeout=300) as client:
        timed(client, {"query": "warm up", "documents": docs[:8], "model": "ce"})
        for model in ("cmc", "ce"):
            for case, texts, extra in (("typical", docs, {}), ("at_cap", cap_docs, {}),
                                       ("overrun", cap_docs, {"timeout_ms": int(DEADLINE_S * 1000)})):
                runs = [timed(client, {"query": qs[r % len(qs)], "documents": texts, "model": model, **extra})
                        for r in range(repeats)]
                row = {"documents": len(texts), "runs": runs,
                       "seconds_median": round(statistics.median(r["seconds"] for r in runs), 3)}
                if case == "overrun":
                    row["overrun_s"] = [round(r["seconds"] - DEADLINE_S, 3) for r in runs]
                    row["overrun_s_max"] = max(row["overrun_s"])
                cases[f"{case}_{model}"] = row
                print(case, model, json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--index", type=Path, default=Path(tempfile.gettempdir()) / "sieve-rerank-cap-index")
    parser.add_argument("--tree", type=Path, default=REPO)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from sieve.service.config import Settings

    cap = Settings(_env_file=None).rerank_max_tokens
    pool = passages(args.data / "corpus.jsonl", 400, args.seed)
    docs = pool[:100]
    qs = queries(args.data, args.repeats, args.seed)
    # as many as fit under the cap for both rerankers, counted as the cap counts them: the cross-encoder reads each
    # passage with the query (its tokens and a separator; the longest query of the run)
    per_pair = max(len(tokenizer()(q, add_special_tokens=False)["input_ids"]) for q in qs) + 1
    counts, cap_docs = [tokens_of([text]) + per_pair for text in pool], []
    for text in pool:
        if sum(counts[:len(cap_docs) + 1]) > cap:
            break
        cap_docs.append(text)
    if not args.index.exists():
        import torch

        from sieve.index import build_index, read_beir_corpus
        from sieve.service.components import load_biencoder

        settings = Settings()
        build_index(read_beir_corpus(REPO / "sieve" / "demo_corpus.jsonl"), load_biencoder(settings, torch.device("cpu")),
                    args.index, progress=False, lexical=settings.lexical_config())
    info = machine() | {"load_avg_start": list(os.getloadavg())}
    with tempfile.TemporaryDirectory() as logs:
        server = Server({"SIEVE_INDEX_DIR": str(args.index)}, Path(logs) / "server.log", shipped_models=True,
                        cwd=args.tree)
        try:
            cases = run(server, docs, cap_docs, qs, args.repeats)
        finally:
            server.stop()
    result = {"machine": info | {"load_avg_end": list(os.getloadavg())}, "tree": str(args.tree),
              "command": " ".join(sys.argv), "rerank_max_tokens": cap,
              "typical": {"documents": len(docs), "characters": [min(map(len, docs)), max(map(len, docs))],
                          "tokens_cmc": tokens_of(docs), "tokens_ce_at_most": tokens_of(docs) + per_pair * len(docs)},
              "at_cap": {"documents": len(cap_docs), "tokens_cmc": tokens_of(cap_docs),
                         "tokens_ce_at_most": tokens_of(cap_docs) + per_pair * len(cap_docs)},
              "deadline_s": DEADLINE_S, "cases": cases}
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
