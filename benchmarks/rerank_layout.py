"""A /rerank end to end, a baseline tree's server (e.g. main before a change to how the cross-encoder's pairs are
tokenized and laid out) against this tree's. Both servers up at once, each with zero-cost forwards
(benchmarks/zero_cost.py: the cross-encoder's forward, the query tower and CMC replaced by stand-ins, the tokenizer
and the pair layout as shipped), so what is measured is the serving ceiling a fast accelerator leaves for the
cross-encoder. Interleaved blocks, the order reversed every other round; /rerank of `--docs` abstracts (texts) at
each client count, from gpu.py's raw client; with `--ids`, the documents named by id instead; with `--real`, the
real models on both sides.

Each row: pairs/s, latency, and the server's CPU per pair (its process tree, from /proc).

    python benchmarks/rerank_layout.py --baseline-tree /work/base --index /work/idx/scifact \
        --out benchmarks/results/rerank_layout_<host>.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu  # noqa: E402
import overhead  # noqa: E402
from sieve.evaluation.report import machine_info  # noqa: E402


def block(side: overhead.Side, bodies: gpu.Bodies, clients: int, warm_s: float, measure_s: float, docs: int) -> dict:
    marks = {}

    def between() -> None:  # after the warm-up: the server's CPU from here
        marks["cpu0"] = overhead.tree_cpu_s(side.proc.pid)

    out = gpu.clients_window(f"{side.url}/rerank", bodies, range(clients), warm_s, measure_s, between, "raw")
    cpu = overhead.tree_cpu_s(side.proc.pid) - marks["cpu0"]
    n, lat = sum(out["codes"].values()), sorted(out["lat"])
    ok = out["codes"].get("200", 0)
    return {"side": side.name, "clients": clients, "requests": n, "ok": ok,
            "pairs_per_s": round(ok * docs / out["seconds"], 1),
            "p50_ms": round(1000 * lat[len(lat) // 2], 1) if lat else None,
            "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
            "server_cpu_ms_per_pair": round(1000 * cpu / max(1, ok * docs), 4),
            "server_cores": round(cpu / out["seconds"], 2), "codes": out["codes"],
            "load_avg_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, required=True)
    parser.add_argument("--index", type=Path, default=Path("/work/idx/scifact"))
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared/data/scifact")
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--ids", action="store_true", help="name the documents by id (the index's texts)")
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--real", action="store_true", help="the real models on both sides (no zero-cost stand-ins)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-s", type=float, default=2.0)
    parser.add_argument("--measure-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    queries = [json.loads(line)["text"] for line in (args.data / "queries.jsonl").open()][:300]
    corpus = [json.loads(line) for _, line in zip(range(3000), (args.data / "corpus.jsonl").open())]
    texts = [f"{d.get('title', '')}\n{d['text']}".strip() for d in corpus]
    bodies = gpu.Bodies(queries, {}, texts, args.docs)
    if args.ids:
        bodies = IdBodies(queries, [d["_id"] for d in corpus], args.docs)
    env = {"SIEVE_CACHE_ENABLED": "false", "SIEVE_MAX_INFLIGHT": "512", "SIEVE_DEFAULT_TIMEOUT_MS": "60000"}
    sides = [overhead.Side("baseline", args.baseline_tree.resolve(), 1, zero_cost=not args.real, env=env),
             overhead.Side("this", REPO, 1, zero_cost=not args.real, env=env)]
    rows = []
    try:
        for side in sides:
            overhead.start(side, args.index, Path(f"/tmp/rerank_layout_{side.name}.log"))
        for r in range(args.rounds):
            for clients in (int(c) for c in args.clients.split(",")):
                for side in (sides if r % 2 == 0 else sides[::-1]):
                    row = {"round": r, **block(side, bodies, clients, args.warm_s, args.measure_s, args.docs)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for side in sides:
            overhead.stop(side)
    summary = overhead.by_round(rows, "side", ("baseline", "this"), ("pairs_per_s", "server_cpu_ms_per_pair", "p50_ms"),
                                "pairs/s by round | server CPU ms/pair | p50 ms")
    for clients in sorted({row["clients"] for row in rows}):
        this, base = (summary[f"{side}@{clients}"]["pairs_per_s"] for side in ("this", "baseline"))
        summary[f"this_over_baseline@{clients}"] = [round(t / b, 3) for t, b in zip(this, base) if b]
        print(f"this / baseline at {clients} clients: "
              + ", ".join(f"{x:.2f}x" for x in summary[f"this_over_baseline@{clients}"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "what": "/rerank with zero-cost forwards: a baseline tree's server against this tree's, both up, "
                    "interleaved",
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "docs": args.docs, "ids": args.ids,
            "real": args.real,
            "trees": {s.name: dict(zip(("commit", "changed"), overhead.tree_state(s.tree))) for s in sides},
            "rows": rows, "summary": summary, "machine": machine_info()}, indent=1) + "\n")


@dataclass
class IdBodies:
    """/rerank bodies naming `n` indexed documents by id, as gpu.Bodies picks texts."""
    queries: list
    ids: list
    n: int

    def __call__(self, j: int) -> dict:
        return {"query": self.queries[j % len(self.queries)], "model": "ce", "top_n": 10,
                "documents": [{"id": self.ids[(j * 101 + i * 7) % len(self.ids)]} for i in range(self.n)]}


if __name__ == "__main__":
    main()
