"""The transfer report: how each pipeline ranks on collections and documents its models never trained on.

Rows for SciFact (all test queries, and the seen-document / unseen-document subsets: a test query is "seen" when
one of its relevant documents is relevant to a training query), NFCorpus test and ArguAna test (a corpus no Sieve
model trains on; identical ids dropped as BEIR does), each with nDCG@10, Recall@100 and p50 latency, plus the
macro-average over the three datasets. The default pipeline is chosen from these rows by `choose_default`.
"""
from __future__ import annotations

import platform
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from sieve.evaluation.dataset import EvalData, load_split
from sieve.evaluation.runner import EvalConfig, Run, collect, pipeline

DATASETS = ("scifact", "nfcorpus", "arguana")
TRAIN_SPLITS = {"scifact": ("train",), "nfcorpus": ("train", "dev"), "arguana": ()}
UNSEEN = {("arguana", "all"), ("scifact", "unseen")}  # the rows no model here can have memorised
LATENCY_FACTOR = 3.0  # the default's p50 may be at most this times the bi-encoder's (SciFact, one client)


def relevant(qrels: dict[str, dict[str, int]]) -> set[str]:
    return {doc for judged in qrels.values() for doc, grade in judged.items() if grade > 0}


def seen_subsets(data: EvalData, train_splits: tuple[str, ...]) -> dict[str, set[str]]:
    """Query ids of the test split by whether some relevant document is also relevant to a training query."""
    seen_docs: set[str] = set()
    for split in train_splits:
        path = data.data_dir / "qrels" / f"{split}.tsv"
        if path.is_file():
            seen_docs |= relevant(load_split(data.data_dir, split).qrels)
    seen = {q for q, judged in data.qrels.items() if relevant({q: judged}) & seen_docs}
    return {"seen": seen, "unseen": set(data.qrels) - seen}


def rows_of(data: EvalData, runs: dict[str, Run], subsets: dict[str, set[str]]) -> list[dict]:
    rows = []
    for subset, ids in {"all": set(data.qrels), **subsets}.items():
        qrels = {q: j for q, j in data.qrels.items() if q in ids}
        if not qrels:
            continue
        for name, run in runs.items():
            s = run.summary(qrels)
            rows.append({"dataset": data.name, "subset": subset, "pipeline": name, "ndcg@10": round(s["ndcg@10"], 4),
                         "recall@100": round(s["recall@100"], 4), "latency_ms_p50": round(s["latency_ms_p50"], 2),
                         "queries": s["queries"]})
    return rows


def macro_rows(rows: list[dict]) -> list[dict]:
    """Per pipeline, the mean over the datasets of their "all" rows (only pipelines that ran on every one)."""
    out = []
    datasets = sorted({r["dataset"] for r in rows})
    for name in dict.fromkeys(r["pipeline"] for r in rows):
        mine = [r for r in rows if r["pipeline"] == name and r["subset"] == "all"]
        if len(mine) != len(datasets):
            continue
        out.append({"dataset": "macro", "subset": "all", "pipeline": name,
                    **{k: round(sum(r[k] for r in mine) / len(mine), 4) for k in ("ndcg@10", "recall@100",
                                                                                 "latency_ms_p50")},
                    "queries": sum(r["queries"] for r in mine)})
    return out


def choose_default(rows: list[dict], baseline: str = "hybrid") -> tuple[str, str]:
    """The pipeline with the best macro nDCG@10 among those whose SciFact p50 is at most LATENCY_FACTOR x the
    bi-encoder's and that are not below `baseline` on any unseen row (ArguAna, SciFact unseen). Returns the name
    and the rule in words."""
    def get(dataset, subset, name):
        return next((r for r in rows if (r["dataset"], r["subset"], r["pipeline"]) == (dataset, subset, name)), None)

    be = get("scifact", "all", "be")
    limit = LATENCY_FACTOR * be["latency_ms_p50"] if be else float("inf")
    eligible = []
    for macro in (r for r in rows if r["dataset"] == "macro"):
        name = macro["pipeline"]
        scifact = get("scifact", "all", name)
        if scifact is None or scifact["latency_ms_p50"] > limit:
            continue
        unseen = [(get(d, s, name), get(d, s, baseline)) for d, s in UNSEEN]
        if any(mine is None or base is None or mine["ndcg@10"] < base["ndcg@10"] for mine, base in unseen):
            continue
        eligible.append((macro["ndcg@10"], name))
    rule = (f"best macro nDCG@10 over {', '.join(DATASETS)} among pipelines whose SciFact p50 <= {LATENCY_FACTOR:g}x "
            f"be's and whose nDCG@10 on every unseen row ({', '.join(f'{d}/{s}' for d, s in sorted(UNSEEN))}) is "
            f">= {baseline}'s")
    return (max(eligible)[1] if eligible else baseline), rule


def transfer_report(load_backend: Callable[[EvalData], object], data_root: Path, pipelines: list[str],
                    cfg: EvalConfig, max_queries: int | None = None, seed: int = 0,
                    log: Callable[[str], None] = print) -> dict:
    """load_backend(data) -> a backend over that dataset's corpus (closed by the caller's context)."""
    rows = []
    for name in DATASETS:
        data = load_split(data_root / name, "test", max_queries=max_queries, seed=seed)
        backend = load_backend(data)
        available = [p for p in pipelines if all(stage in backend.stages for stage in pipeline(p).needs)]
        skipped = sorted(set(pipelines) - set(available))
        if skipped:
            log(f"{name}: skipping {', '.join(skipped)} (a stage they need is not configured)")
        runs = {}
        for recipe in available:
            runs[recipe] = collect(backend, pipeline(recipe), data, cfg)
            log(f"{name} {recipe}: nDCG@10 {runs[recipe].summary(data.qrels)['ndcg@10']:.4f}")
        subsets = seen_subsets(data, TRAIN_SPLITS[name]) if name == "scifact" else {}
        rows += rows_of(data, runs, subsets)
    rows += macro_rows(rows)
    default, rule = choose_default(rows)
    return {"rows": rows, "default": default, "default_rule": rule, "pipelines": pipelines,
            "eval": {**asdict(cfg), "max_queries": max_queries, "seed": seed},
            "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine()}}


def merge(base: dict, new: dict, tag: str | None) -> dict:
    """Rows of `new` (pipelines renamed "<name>[tag]", e.g. another CMC checkpoint) added to `base`; the macro rows
    and the default are computed anew over all of them. Rows of `base` with those names are replaced."""
    rename = (lambda name: f"{name}[{tag}]") if tag else (lambda name: name)
    added = [{**r, "pipeline": rename(r["pipeline"])} for r in new["rows"] if r["dataset"] != "macro"]
    names = {r["pipeline"] for r in added}
    rows = [r for r in base["rows"] if r["dataset"] != "macro" and r["pipeline"] not in names] + added
    rows += macro_rows(rows)
    default, rule = choose_default(rows)
    pipelines = list(dict.fromkeys([*base["pipelines"], *(rename(p) for p in new["pipelines"])]))
    runs = [*base.get("runs", [{"command": base.get("command"), "pipelines": base["pipelines"]}]),
            {"command": new.get("command"), "pipelines": sorted(names), "tag": tag}]
    return {**base, "rows": rows, "default": default, "default_rule": rule, "pipelines": pipelines, "runs": runs}


def render(doc: dict) -> str:
    names = doc["pipelines"]
    cols = [(r["dataset"], r["subset"]) for r in doc["rows"]]
    cols = list(dict.fromkeys(cols))
    head = "| pipeline | " + " | ".join(f"{d} {s}" if s != "all" else d for d, s in cols) + " | SciFact p50 ms |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for name in names:
        cells = []
        for d, s in cols:
            r = next((r for r in doc["rows"] if (r["dataset"], r["subset"], r["pipeline"]) == (d, s, name)), None)
            cells.append("-" if r is None else f"{r['ndcg@10']:.3f}")
        p50 = next((r["latency_ms_p50"] for r in doc["rows"]
                    if (r["dataset"], r["subset"], r["pipeline"]) == ("scifact", "all", name)), None)
        lines.append(f"| {name}{' (default)' if name == doc['default'] else ''} | " + " | ".join(cells) +
                     f" | {'-' if p50 is None else f'{p50:.1f}'} |")
    return "nDCG@10 on the test splits\n" + "\n".join(lines)
