"""What an eval run leaves behind: markdown tables on stdout and eval_<name>.json."""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path

from sieve.evaluation.summary import RECALL_KS

STAGES = ("be_encode", "cmc_encode", "anncur", "mips", "cmc", "mix", "ce", "ce_late", "total")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def quality_table(pipelines: dict[str, dict]) -> str:
    header = ["pipeline", "nDCG@10", "MRR@10", *(f"R@{k}" for k in RECALL_KS), "p50 ms", "p95 ms", "mean ms",
              "CE pairs/q", "queries"]
    rows = [[name, *(f"{r[key]:.4f}" for key in ("ndcg@10", "mrr@10", *(f"recall@{k}" for k in RECALL_KS))),
             *(f"{r[f'latency_ms_{s}']:.1f}" for s in ("p50", "p95", "mean")), f"{r['ce_pairs']:g}", str(r["queries"])]
            for name, r in pipelines.items()]
    return markdown_table(header, rows)


def stage_table(pipelines: dict[str, dict]) -> str:
    """Each cell: mean / p50 / p95 ms of that stage, '-' where the pipeline does not run it."""
    def cell(stats: dict | None) -> str:
        return "-" if stats is None else f"{stats['mean']:.1f} / {stats['p50']:.1f} / {stats['p95']:.1f}"

    rows = [[name, *(cell(r["stage_latency_ms"].get(stage)) for stage in STAGES)] for name, r in pipelines.items()]
    return markdown_table(["pipeline (ms: mean / p50 / p95)", *STAGES], rows)


def table2_table(table2: dict) -> str:
    rows = [[("BE" if r["source"] == "be" else f"BE+CMC({r['cmc_over']})"), str(r["k_prime"]), f"{r['ndcg@10']:.4f}",
             f"{r['ce_ms_mean']:.1f}", f"{r['ce_time_vs_be64']:.2f}", f"{r['cmc_ms_mean']:.1f}"] for r in table2["rows"]]
    return markdown_table(["candidates from", "K'", "CE nDCG@10", "CE ms/q", "CE time vs BE(64)", "CMC ms/q"], rows)


def render(doc: dict) -> str:
    parts = [f"## {doc['dataset']} ({doc['split']}, {doc['queries']} queries)", "", quality_table(doc["pipelines"]),
             "", stage_table(doc["pipelines"])]
    if doc.get("table2"):
        parts += ["", f"### Table 2 ({doc['table2']['queries']} queries)", "", table2_table(doc["table2"])]
    return "\n".join(parts)


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def vector_flags() -> list[str]:
    """The CPU's SIMD/matrix flags that change what torch runs (avx2, avx512*, amx*, fma, f16c)."""
    from sieve.models.precision import cpu_flags

    return sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))


def machine_info() -> dict:
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu_model(),
            "cpu_count": os.cpu_count(), "cpus_usable": usable, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "cpu_flags": vector_flags(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def eval_document(data, pipelines: dict, settings: dict, command: str, table2: dict | None = None) -> dict:
    doc = {"dataset": data.name, "split": data.split, "queries": len(data.queries), "pipelines": pipelines,
           "settings": settings, "machine": machine_info(), "command": command,
           "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if table2 is not None:
        doc["table2"] = table2
    return doc


def write_json(doc: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"eval_{doc['dataset']}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
