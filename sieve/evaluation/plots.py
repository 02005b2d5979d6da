"""Two figures per eval run: recall@k curves, and nDCG@10 against median latency. Agg backend: no display."""
from __future__ import annotations

from pathlib import Path

from sieve.evaluation.summary import RECALL_KS

MARKERS = ("o", "s", "^", "D")
DASHES = ("-", "--", "-.", ":")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ticker():
    import matplotlib.ticker

    return matplotlib.ticker


def recall_plot(doc: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for i, (name, r) in enumerate(doc["pipelines"].items()):
        # distinct dashes and shrinking markers keep identical curves (untrained CMC = BE) both visible
        ax.plot(RECALL_KS, [r[f"recall@{k}"] for k in RECALL_KS], label=name, marker=MARKERS[i % 4],
                linestyle=DASHES[i % 4], markersize=8 - 1.5 * (i % 4), linewidth=1.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(RECALL_KS, [str(k) for k in RECALL_KS])
    ax.set_xlabel("k (candidates kept, log2 scale)")
    ax.set_ylabel("Recall@k")
    ax.set_ylim(0, 1.05)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(f"Recall@k, {doc['dataset']} {doc['split']} ({doc['queries']} queries)")
    ax.legend(loc="lower right")
    return save(fig, path)


def quality_latency_plot(doc: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    points = {name: (r["latency_ms_p50"], r["ndcg@10"]) for name, r in doc["pipelines"].items()}
    for i, (name, (x, y)) in enumerate(points.items()):
        ax.scatter([x], [y], s=50, zorder=3)
        # alternate labels above and below: an untrained CMC lands on the bi-encoder's point
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(7, 6 if i % 2 == 0 else -14), fontsize=10)
    xs, ys = [p[0] for p in points.values()], [p[1] for p in points.values()]
    if xs and max(xs) > 20 * min(xs):
        ax.set_xscale("log")  # CE pipelines run 10-100x longer than BE alone: a linear axis squashes the rest
        ax.set_xlim(min(xs) / 1.5, max(xs) * 2)  # room for the labels right of the points
        ax.xaxis.set_major_formatter(ticker().ScalarFormatter())  # 100, 1000 rather than 10^2, 10^3
    else:
        ax.set_xlim(0, max(xs, default=1) * 1.25)
    pad = max(0.02, (max(ys) - min(ys)) * 0.15) if ys else 0.02
    ax.set_ylim(min(ys, default=0) - pad, max(ys, default=1) + pad)
    ax.set_xlabel("median latency per query, ms (p50 of total)")
    ax.set_ylabel("nDCG@10")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"Quality vs latency, {doc['dataset']} {doc['split']}")
    return save(fig, path)


def save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    pyplot().close(fig)
    return path


def write_plots(doc: dict, out_dir: Path) -> list[Path]:
    stem = out_dir / f"eval_{doc['dataset']}"
    return [recall_plot(doc, Path(f"{stem}_recall.png")), quality_latency_plot(doc, Path(f"{stem}_quality_latency.png"))]


def write_transfer_plot(doc: dict, path: Path) -> Path:
    """Grouped bars: nDCG@10 of each pipeline on each dataset/subset of the transfer report, the default marked."""
    plt = pyplot()
    groups = list(dict.fromkeys((r["dataset"], r["subset"]) for r in doc["rows"]))
    names = doc["pipelines"]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(groups) * max(1, len(names)) / 3), 4.8), dpi=120)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [next((r["ndcg@10"] for r in doc["rows"] if (r["dataset"], r["subset"], r["pipeline"]) ==
                        (d, s, name)), float("nan")) for d, s in groups]
        label = f"{name} (default)" if name == doc["default"] else name
        ax.bar([g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))], values, width, label=label,
               edgecolor="black" if name == doc["default"] else None, linewidth=1.5)
    ax.set_xticks(range(len(groups)), [d if s == "all" else f"{d}\n{s} docs" for d, s in groups])
    ax.set_ylabel("nDCG@10 (test)")
    ax.set_title("Transfer report: nDCG@10 by collection (ArguAna and SciFact unseen: no model here saw them)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="upper right")
    return save(fig, path)
