"""Figures of benchmarks/anncur.py (Agg backend, no display).

figure3: the shape of Yadav et al. 2022, Figure 3: one row per cross-encoder, one panel per k (Top-k-Recall
against cross-encoder calls per query, annCUR for each k_i and bi-encoder retrieve-and-rerank), and a last panel
with nDCG@10 against the same budget. spectrum_plot: the normalised singular values of each cross-encoder's
score matrix (anchor and test queries x documents), the paper's argument for the [emb] cross-encoder.
"""
from __future__ import annotations

from pathlib import Path

from benchmarks.anncur_eval import RECALL_KS


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves(rows: list[dict], key: str) -> dict[str, tuple[list, list]]:
    """label -> (ce_calls, values) for be+ce and each annCUR k_i, in budget order."""
    out: dict[str, tuple[list, list]] = {}
    for r in sorted(rows, key=lambda r: r["ce_calls"]):
        if r["method"] == "ce-exhaustive" or key not in r:
            continue
        label = "BE+CE" if r["method"] == "be+ce" else f"annCUR k_i={r['k_i']}"
        out.setdefault(label, ([], []))
        out[label][0].append(r["ce_calls"])
        out[label][1].append(r[key])
    return out


def figure3(doc: dict, path: Path) -> Path:
    plt = pyplot()
    labels = list(doc["cross_encoders"])
    keys = [f"topk_recall@{k}" for k in RECALL_KS if any(f"topk_recall@{k}" in r for r in doc["rows"])] + ["ndcg@10"]
    fig, axes = plt.subplots(len(labels), len(keys), figsize=(4.2 * len(keys), 3.6 * len(labels)), dpi=110,
                             squeeze=False)
    for i, label in enumerate(labels):
        rows = [r for r in doc["rows"] if r["cross_encoder"] == label]
        for j, key in enumerate(keys):
            ax = axes[i][j]
            for name, (x, y) in curves(rows, key).items():
                be = name == "BE+CE"
                ax.plot(x, y, label=name, marker="s" if be else "o", linestyle="--" if be else "-",
                        color="black" if be else None, markersize=4)
            if key == "ndcg@10":  # the cross-encoder over every document: the ceiling of both methods
                ceiling = next(r["ndcg@10"] for r in rows if r["method"] == "ce-exhaustive")
                ax.axhline(ceiling, color="grey", linestyle=":", label="CE, all documents")
            ax.set_xlabel("cross-encoder calls per query")
            ax.set_ylabel(key.replace("topk_recall@", "Top-k-Recall, k=") if "recall" in key else "nDCG@10")
            ax.set_title(f"{label} ({doc['cross_encoders'][label]['head']})")
            ax.grid(True, alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    s = doc["scale"]
    fig.suptitle(f"annCUR vs BE+CE, {doc['dataset']} {doc['split']}: {s['test_queries']} queries, "
                 f"{s['documents']} documents, k_q={s['anchor_queries_k_q']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def spectrum_plot(doc: dict, path: Path) -> Path:
    """Raw spectrum on the left; on the right (when the JSON has it) the spectrum after subtracting each query's mean
    score, the part of the matrix that orders documents."""
    plt = pyplot()
    keys = [k for k in ("spectrum_all", "spectrum_all_centered")
            if all(k in info for info in doc["cross_encoders"].values())]
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4), dpi=110, squeeze=False)
    shape = next(iter(doc["cross_encoders"].values()))["spectrum_all"]["shape"]
    for ax, key in zip(axes[0], keys):
        for label, info in doc["cross_encoders"].items():
            values = info[key]["normalized"]
            ax.plot(range(1, len(values) + 1), values, marker=".", label=f"{label} ({info['head']})")
        ax.set_yscale("log")
        ax.set_xlabel("singular value index")
        ax.set_ylabel("singular value / largest")
        kind = "rows centred" if key.endswith("centered") else "raw scores"
        ax.set_title(f"{doc['dataset']}: {shape[0]} queries x {shape[1]} documents, {kind}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Score-matrix spectrum", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
