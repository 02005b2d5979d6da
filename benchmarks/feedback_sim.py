"""Simulated users teach a real `sieve serve` from their clicks (issue 33): does CMC learn from feedback?

A copy of a prebuilt index is served with SIEVE_FEEDBACK_ENABLED (and a few randomised adjacent swaps, from which the
learner estimates position bias). Simulated users issue sessions: a query drawn from the TRAIN split, POST /search
(top 10), then a position-based click model: rank r examined with probability (1/r)^eta, an examined result
clicked with p+ when the qrels judge it relevant and p- when not; the clicks go through POST /feedback. At each
checkpoint the server learns (`sieve feedback learn` on its logs: the guard decides whether the model is
published; a published one is swapped in live by POST /admin/index/reload) and nDCG@10 is measured on the
evaluation queries through the same code `sieve eval --server` uses (HttpBackend, collect, hybrid+cmc), against a
second server on the same index with feedback off (so no randomised swap touches the measured rankings).

Scenarios (--scenario):
  train-test   sessions over train queries; evaluated on the TEST split (queries the clicks never came from)
  head         sessions over --head train queries repeated; evaluated on those queries' own qrels
The full-information ceiling (--ceiling): the same learner (feedback_cli.learn_lists, same lists, splits and
training) with the train split's qrels as targets instead of clicks, published regardless of the guard (it is a
ceiling, not a deployment) and evaluated the same way, in the same run. With --learn memory (the click memory,
sieve/feedback/memory.py) the ceiling is the memory learner on the impressions the server logged, every shown
document examined and clicked exactly when the train qrels judge it relevant. Test queries are also reported in
two groups: those with a relevant document that a train query also has (seen) and the rest (unseen).

    .venv/bin/python benchmarks/feedback_sim.py --data ../shared/data/scifact --index /work/idx/scifact \
        --sessions 3000 --checkpoints 1000,3000 --ceiling --out benchmarks/results/feedback_sim_scifact.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

import sieve.stages  # noqa: E402,F401 (registers the core stages: hybrid, cmc)

from benchmarks.overhead import free_port, wait_ready  # noqa: E402
from sieve.evaluation.backends import HttpBackend  # noqa: E402
from sieve.evaluation.dataset import load_split  # noqa: E402
from sieve.evaluation.metrics import ndcg_at_k  # noqa: E402
from sieve.evaluation.runner import EvalConfig, collect, pipeline  # noqa: E402


class Served:
    """`sieve serve` on the index copy, feedback on."""

    def __init__(self, index: Path, log: Path, swap: float, extra: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "SIEVE_INDEX_DIR": str(index), "SIEVE_PORT": str(self.port), "SIEVE_HOST": "127.0.0.1",
               "SIEVE_FEEDBACK_ENABLED": "true", "SIEVE_FEEDBACK_SWAP_FRACTION": str(swap),
               "SIEVE_CROSS_ENCODER_ENABLED": "false", "SIEVE_LOG_LEVEL": "warning", **(extra or {})}
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "sieve.cli", "serve"], cwd=REPO, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.proc, self.url, log, 900)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def evaluate(url: str, data) -> dict:
    backend = HttpBackend(url)
    try:
        run = collect(backend, pipeline("hybrid+cmc"), data, EvalConfig())
    finally:
        backend.close()
    per_query = {q: ndcg_at_k(run.rankings[q], data.qrels[q], 10) for q in data.qrels}
    ready = httpx.get(f"{url}/readyz").json()
    return {"ndcg@10": round(float(np.mean(list(per_query.values()))), 4), "per_query": per_query,
            "cmc": (ready.get("cmc") or {}).get("source"), "click_memory": ready.get("click_memory")}


def seen_groups(train, test) -> dict[str, list[str]]:
    """Test queries with a relevant document that is also relevant to a train query (seen) and the rest
    (benchmarks/seen_docs_split.py's split)."""
    known = {d for judged in train.qrels.values() for d, g in judged.items() if g > 0}
    seen = [q for q, judged in test.qrels.items() if any(g > 0 and d in known for d, g in judged.items())]
    return {"seen": seen, "unseen": [q for q in test.qrels if q not in set(seen)]}


def by_group(after: dict, before: dict, groups: dict | None) -> dict:
    if not groups:
        return {}
    out = {}
    for name, qs in groups.items():
        if qs:
            a, b = ({"per_query": {q: r["per_query"][q] for q in qs}} for r in (after, before))
            out[name] = {"queries": len(qs), "default": round(float(np.mean(list(b["per_query"].values()))), 4),
                         "ndcg@10": round(float(np.mean(list(a["per_query"].values()))), 4), **paired(a, b)}
    return out


def paired(after: dict, before: dict, seed: int = 0) -> dict:
    qs = sorted(before["per_query"])
    d = np.array([after["per_query"][q] - before["per_query"][q] for q in qs])
    rng = np.random.default_rng(seed)
    means = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(2000)]
    return {"delta": round(float(d.mean()), 4),
            "interval95": [round(float(np.quantile(means, 0.025)), 4), round(float(np.quantile(means, 0.975)), 4)]}


class Users:
    """Position-based click model over the judged train queries."""

    def __init__(self, data, eta: float, p_plus: float, p_minus: float, seed: int):
        self.data, self.eta, self.p_plus, self.p_minus = data, eta, p_plus, p_minus
        self.ids = sorted(data.queries)
        self.rng = np.random.default_rng(seed)

    def session(self, client: httpx.Client, qid: str, rng: np.random.Generator) -> int:
        answer = client.post("/search", json={"query": self.data.queries[qid], "top_k": 10})
        answer.raise_for_status()
        body = answer.json()
        judged = self.data.qrels[qid]
        events = []
        for rank, hit in enumerate(body["results"], 1):
            if rng.random() < rank ** -self.eta:
                p = self.p_plus if judged.get(hit["id"], 0) > 0 else self.p_minus
                if rng.random() < p:
                    events.append({"request_id": body["request_id"], "doc_id": hit["id"]})
        if events:
            r = client.post("/feedback", json={"events": events})
            r.raise_for_status()
        return len(events)


def run_sessions(url: str, users: Users, n: int, seed: int, threads: int = 3) -> tuple[int, float]:
    qids = users.rng.choice(users.ids, size=n)
    began = time.monotonic()

    def work(part):
        rng = np.random.default_rng([seed, part])
        with httpx.Client(base_url=url, timeout=120) as client:
            return sum(users.session(client, q, rng) for q in qids[part::threads])

    with ThreadPoolExecutor(threads) as pool:
        clicks = sum(pool.map(work, range(threads)))
    return clicks, time.monotonic() - began


def learn(index: Path, steps: int, split: str, what: str = "both", extra: tuple = ()) -> dict:
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sieve.cli", "feedback", "learn", "--index", str(index),
                           "--steps", str(steps), "--split", split, "--learn", what, *extra], cwd=REPO,
                          capture_output=True, text=True)
    out = proc.stdout[proc.stdout.find("{"):]
    report = json.loads(out) if out.strip() else {}
    report = {k: report.get(k) for k in ("installed", "not_installed", "guard", "split", "propensity", "best_step",
                                          "train_s", "answers", "lists", "memory")}
    report.update({"exit": proc.returncode, "wall_s": round(time.monotonic() - began, 1)})
    if proc.returncode not in (0, 2, 3):
        report["stderr"] = proc.stderr[-2000:]
    return report


def reload(url: str) -> dict:
    return httpx.post(f"{url}/admin/index/reload", timeout=120).json()


def ceiling(index: Path, data_train, steps: int, depth: int) -> dict:
    """The same learner on the train qrels (full information): lists from the first stage, targets = relevance."""
    import torch  # noqa: F401

    from sieve.feedback.dataset import Entry, build
    from sieve.feedback.records import first_stage, query_key, unpack
    from sieve.pipeline.searcher import Searcher, SearchParams
    from sieve.service.config import Settings
    from sieve.service.runtime import searcher_options
    from sieve.training.feedback_cli import opened, save
    from sieve.training.feedback_config import LearnConfig
    from sieve.training.feedback_learn import Vectors, guard, split, train

    settings = Settings(index_dir=index)
    biencoder, idx, store, served = opened(settings)
    searcher = Searcher(biencoder, idx, **searcher_options(settings))
    entries = []
    for qid, text in data_train.queries.items():
        q = searcher.normalise(text)
        rec = first_stage(searcher.search(SearchParams(q, top_k=1, retrieve_k=depth, rerank="none",
                                                        retriever="hybrid", cmc_k=1)), depth)
        targets = {d: 1.0 for d, g in data_train.qrels[qid].items() if g > 0}
        entries.append(Entry(query_key(q), unpack(rec["vector"]), rec["candidates"], unpack(rec["be"]),
                             unpack(rec["bm25"]), targets))
    searcher.close()
    cfg = LearnConfig(depth=depth, steps=steps)
    lists, stats = build(entries, idx, depth)
    rest, held = split(lists, cfg.heldout, cfg.seed)
    fit, validation = split(rest, cfg.validation, cfg.seed + 1)
    vectors = Vectors(idx, lists)
    base = served.model.float().cpu().eval()
    model, record = train(cfg, fit, validation, base, vectors, print)
    report = guard(model, base, held, vectors, cfg)
    summary = {"command": "benchmarks/feedback_sim.py ceiling", "index_version": idx.version,
               "served": {"name": served.name, "path": str(served.path) if served.path else None},
               "split": {"train": len(fit), "validation": len(validation), "heldout": len(held)}, "guard": report}
    path = store.publish(save(model, biencoder, store.new_work_dir(), summary, lists, idx))
    idx.close()
    return {"lists": stats, "guard": report, "best_step": record["best_step"], "train_s": record["train_s"],
            "published": str(path)}


def relevant_by_key(data_train) -> dict[str, set[str]]:
    """Query key (records.query_key of the whitespace-normalised text) -> the documents the split's qrels judge
    relevant (grade > 0): the clicks of the full-information ceiling."""
    from sieve.feedback.records import query_key

    return {query_key(" ".join(text.split())): {d for d, g in data_train.qrels.get(q, {}).items() if g > 0}
            for q, text in data_train.queries.items()}


def memory_ceiling(index: Path, work: Path, data_train, split: str, extra: tuple = ()) -> dict:
    """The click memory's full-information ceiling: the same impressions the server logged, every shown document
    examined (propensity 1: --eta 0, no swaps copied) and clicked exactly when the train qrels judge it relevant;
    learned, judged and published by the same command (`--learn memory`; `extra`: its options that are not the
    clicks' own, as the learner's run got them)."""
    from sieve.feedback.log import AppendLog, read_records

    relevant = relevant_by_key(data_train)
    root = work / "ceiling-feedback"
    shutil.rmtree(root, ignore_errors=True)
    impressions, events = AppendLog(root, "impressions", 1 << 40), AppendLog(root, "events", 1 << 40)
    records = [{**r, "swap": None} for r in read_records(index / "feedback", "impressions")]
    impressions.append(records)
    events.append({"request_id": r["request_id"], "doc_id": d, "type": "click", "received": r["t"]}
                  for r in records for d in r["shown"] if d in relevant.get(r["query_key"], ()))
    impressions.close(), events.close()
    (index / "clicks" / "CURRENT").unlink(missing_ok=True)  # judged against the CMC alone, not the click memory
    return learn(index, 0, split, "memory", ("--feedback-dir", str(root), "--eta", "0") + extra)


def main() -> None:
    from sieve.evaluation.report import machine_info

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--index", type=Path, required=True, help="prebuilt index (copied; never written)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/feedback-sim"))
    ap.add_argument("--scenario", choices=["train-test", "head"], default="train-test")
    ap.add_argument("--head", type=int, default=100, help="head queries (scenario head)")
    ap.add_argument("--sessions", type=int, default=3000)
    ap.add_argument("--checkpoints", default="", help="session counts to learn at (default: the end only)")
    ap.add_argument("--eta", type=float, default=1.0)
    ap.add_argument("--p-plus", type=float, default=0.9)
    ap.add_argument("--p-minus", type=float, default=0.05)
    ap.add_argument("--swap", type=float, default=0.05, help="SIEVE_FEEDBACK_SWAP_FRACTION")
    ap.add_argument("--explore", type=float, default=0.0, help="SIEVE_FEEDBACK_EXPLORE_FRACTION (0 = off)")
    ap.add_argument("--explore-depth", type=int, default=50, help="SIEVE_FEEDBACK_EXPLORE_DEPTH")
    ap.add_argument("--explore-slots", type=int, default=1, help="SIEVE_FEEDBACK_EXPLORE_SLOTS")
    ap.add_argument("--explore-from", choices=["ranks", "neighbours"], default="ranks",
                    help="SIEVE_FEEDBACK_EXPLORE_FROM")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--propensities", choices=["position", "policy"], default="policy",
                    help="`sieve feedback learn --propensities`: a click's weight")
    ap.add_argument("--clip", type=float, default=None, help="`sieve feedback learn --clip` (default: the command's)")
    ap.add_argument("--support", choices=["shown", "all"], default=None,
                    help="`sieve feedback learn --support` (default: the command's)")
    ap.add_argument("--guard-support", choices=["both", "shown", "all"], default=None,
                    help="`sieve feedback learn --guard-support` (default: the command's)")
    ap.add_argument("--noise", choices=["estimated", "off"], default=None,
                    help="`sieve feedback learn --noise` (default: the command's)")
    ap.add_argument("--estimate", choices=["ips", "dr"], default=None,
                    help="`sieve feedback learn --estimate` (default: the command's)")
    ap.add_argument("--doc-related", default=None,
                    help="`sieve feedback learn --doc-related` (select, a cosine or off; default: the command's)")
    ap.add_argument("--doc-gate", default=None, help="`sieve feedback learn --doc-gate` (a cosine or off; default: "
                    "the command's)")
    ap.add_argument("--memory-guard", choices=["auto", "heldout", "crossfit"], default=None,
                    help="`sieve feedback learn --memory-guard` (default: the command's)")
    ap.add_argument("--memory-publish", choices=["refit", "fold"], default=None,
                    help="`sieve feedback learn --memory-publish` (default: the command's)")
    ap.add_argument("--split", choices=["query", "time"], default="query", help="the learner's held-out split")
    ap.add_argument("--ceiling", action="store_true", help="the full-information ceiling of what --learn learns")
    ap.add_argument("--learn", choices=["both", "cmc", "memory"], default="both", help="what `sieve feedback learn` "
                    "learns at each checkpoint (the CMC, the click memory, or both)")
    ap.add_argument("--max-eval", type=int, default=None, help="evaluate on at most this many queries")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.doc_gate:  # checked now, not at the first checkpoint after minutes of sessions
        from sieve.training.feedback_cli import cosine_or_off
        try:
            cosine_or_off(args.doc_gate)
        except argparse.ArgumentTypeError as e:
            ap.error(f"--doc-gate: {e}")
    if args.doc_related:
        from sieve.training.feedback_cli import select_cosine_or_off
        try:
            select_cosine_or_off(args.doc_related)
        except argparse.ArgumentTypeError as e:
            ap.error(f"--doc-related: {e}")

    train_data = load_split(args.data, "train")
    if args.scenario == "head":
        heads = sorted(np.random.default_rng(args.seed).choice(sorted(train_data.queries), args.head, replace=False))
        train_data = dataclasses.replace(train_data, queries={q: train_data.queries[q] for q in heads},
                                         qrels={q: train_data.qrels[q] for q in heads})
        eval_data = train_data
    else:
        eval_data = load_split(args.data, "test", max_queries=args.max_eval, seed=args.seed)
    groups = seen_groups(train_data, eval_data) if args.scenario != "head" else None
    work = args.work / f"{args.data.name}-{args.scenario}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    index = work / "index"
    shutil.copytree(args.index, index, ignore=shutil.ignore_patterns("adapted", "feedback"))
    checkpoints = sorted({int(c) for c in args.checkpoints.split(",") if c} | {args.sessions})
    doc = {"dataset": args.data.name, "scenario": args.scenario, "sessions": args.sessions,
           "click_model": {"eta": args.eta, "p_plus": args.p_plus, "p_minus": args.p_minus, "top_k": 10},
           "swap_fraction": args.swap,
           "explore": {"fraction": args.explore, "depth": args.explore_depth, "slots": args.explore_slots,
                       "from": args.explore_from},
           "train_queries": len(train_data.queries), "eval_split":
           "train (head queries' own qrels)" if args.scenario == "head" else "test",
           "eval_queries": len(eval_data.queries), "steps": args.steps, "learn": args.learn, "split": args.split,
           "propensities": args.propensities, "clip": args.clip, "support": args.support,
           "guard_support": args.guard_support, "doc_gate": args.doc_gate, "noise": args.noise,
           "estimate": args.estimate, "doc_related": args.doc_related, "memory_guard": args.memory_guard,
           "memory_publish": args.memory_publish,
           "command": " ".join(sys.argv),
           "machine": machine_info(), "load_before": os.getloadavg(), "curve": []}
    server = Served(index, work / "server.log", args.swap, {
        "SIEVE_FEEDBACK_EXPLORE_FRACTION": str(args.explore), "SIEVE_FEEDBACK_EXPLORE_DEPTH": str(args.explore_depth),
        "SIEVE_FEEDBACK_EXPLORE_SLOTS": str(args.explore_slots), "SIEVE_FEEDBACK_EXPLORE_FROM": args.explore_from})
    # nDCG is measured on a second server over the same index with feedback off: no randomised swap in its answers
    judge = Served(index, work / "judge.log", 0.0, {"SIEVE_FEEDBACK_ENABLED": "false"})
    try:
        base = evaluate(judge.url, eval_data)
        doc["default"] = {"ndcg@10": base["ndcg@10"], "cmc": base["cmc"],
                          "groups": {k: len(v) for k, v in (groups or {}).items()}}
        print(f"default nDCG@10 {base['ndcg@10']}", flush=True)
        users = Users(train_data, args.eta, args.p_plus, args.p_minus, args.seed)
        done = clicks = 0
        for point in checkpoints:
            n, s = run_sessions(server.url, users, point - done, args.seed + point)
            done, clicks = point, clicks + n
            extra = ("--propensities", args.propensities) + (("--clip", str(args.clip)) if args.clip else ()) + \
                (("--support", args.support) if args.support else ()) + \
                (("--guard-support", args.guard_support) if args.guard_support else ()) + \
                (("--doc-gate", args.doc_gate) if args.doc_gate else ()) + \
                (("--noise", args.noise) if args.noise else ()) + \
                (("--estimate", args.estimate) if args.estimate else ()) + \
                (("--doc-related", str(args.doc_related)) if args.doc_related else ()) + \
                (("--memory-guard", args.memory_guard) if args.memory_guard else ()) + \
                (("--memory-publish", args.memory_publish) if args.memory_publish else ())
            learned = learn(index, args.steps, args.split, args.learn, extra)
            reloaded = reload(server.url)
            reload(judge.url)
            after = evaluate(judge.url, eval_data)
            entry = {"sessions": done, "clicks": clicks, "sessions_s": round(s, 1), "learn": learned,
                     "swapped": reloaded.get("cmc_changed"), "ndcg@10": after["ndcg@10"], "cmc": after["cmc"],
                     "click_memory": after["click_memory"], "vs_default": paired(after, base),
                     "groups": by_group(after, base, groups), "load": os.getloadavg()}
            doc["curve"].append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "learn"}), json.dumps(learned.get("guard")),
                  flush=True)
        if args.ceiling and args.learn in ("both", "memory"):
            doc["memory_ceiling"] = memory_ceiling(index, work, train_data, args.split,
                                                   ("--memory-publish", args.memory_publish) if args.memory_publish
                                                   else ())
            reload(judge.url)
            top = evaluate(judge.url, eval_data)
            doc["memory_ceiling"].update({"ndcg@10": top["ndcg@10"], "vs_default": paired(top, base),
                                          "click_memory": top["click_memory"],
                                          "groups": by_group(top, base, groups)})
            print("memory ceiling", json.dumps(doc["memory_ceiling"]), flush=True)
        if args.ceiling and args.learn in ("both", "cmc"):
            doc["ceiling"] = ceiling(index, train_data, args.steps, 50)
            reload(judge.url)
            top = evaluate(judge.url, eval_data)
            doc["ceiling"].update({"ndcg@10": top["ndcg@10"], "vs_default": paired(top, base)})
            print("ceiling", json.dumps(doc["ceiling"]), flush=True)
    finally:
        server.stop()
        judge.stop()
    doc["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, args.out.with_suffix(".png"))


def plot(doc: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no learning-curve plot", flush=True)
        return
    xs = [0] + [p["clicks"] for p in doc["curve"]]
    ys = [doc["default"]["ndcg@10"]] + [p["ndcg@10"] for p in doc["curve"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, marker="o", label="learned from clicks (served)")
    ax.axhline(doc["default"]["ndcg@10"], color="gray", ls="--", label="default")
    if "ceiling" in doc:
        ax.axhline(doc["ceiling"]["ndcg@10"], color="green", ls=":", label="full-information ceiling (CMC)")
    if "memory_ceiling" in doc:
        ax.axhline(doc["memory_ceiling"]["ndcg@10"], color="purple", ls=":", label="full-information ceiling (memory)")
    ax.set_xlabel("click events")
    ax.set_ylabel(f"nDCG@10 ({doc['eval_split']})")
    ax.set_title(f"{doc['dataset']} {doc['scenario']}: p+={doc['click_model']['p_plus']} "
                 f"p-={doc['click_model']['p_minus']} eta={doc['click_model']['eta']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}", flush=True)


if __name__ == "__main__":
    main()
