"""The model card `sieve adapt` writes next to an adapted CMC: data, command, commit, held-out and seen metrics."""
from __future__ import annotations


def _row(name: str, metrics: dict) -> str:
    cells = [f"{metrics[k]['mrr@10']:.4f} / {metrics[k]['hit@1']:.4f}" for k in ("first_stage", "shipped_default",
                                                                               "adapted")]
    return f"| {name} ({metrics['adapted']['queries']}) | " + " | ".join(cells) + " |"


def model_card(summary: dict, adapted: dict) -> str:
    from sieve.training.checkpointing import git_commit

    cfg, m = summary["config"], summary["metrics"]
    return "\n".join([
        f"# Adapted CMC (`sieve adapt`, {adapted['created']})", "",
        "A CMC with attention layers over the candidates and the first-stage evidence, trained on this index's "
        "documents alone: pseudo-queries made from the documents, each with its source document as the one "
        "positive among the served hybrid candidates. No query or relevance label was read.", "",
        "## Data, command, commit", "",
        f"- Index version {summary['index_version']}, {summary['documents']} documents (ids in documents.txt, "
        f"sha256 {adapted['corpus_hash'][:16]}...); {summary['heldout_documents']} documents held out of training "
        "for selection.",
        f"- Pseudo-queries: generator `{cfg['generator']}`, {summary['pseudo_queries']} in all; lists whose source is "
        f"among the top {cfg['k']} candidates: {summary['lists']['train']} trained on, {summary['lists']['heldout']} "
        f"held out. Shape: {summary['query_stats']}.",
        f"- Model: {cfg['n_layers']} attention layer(s), ffn x{cfg['ffn_mult']}, 8 evidence features; started from "
        f"`{cfg['start']}`; {summary['steps']} steps of {cfg['batch_queries']} lists, lr {cfg['lr']}; best held-out "
        f"step {summary['best_step']}.",
        f"- Command: `{summary['command']}` ({summary['wall_s']} s); code: git commit `{git_commit()}`.", "",
        "## Metrics on pseudo-queries (MRR@10 / hit@1 of the source document)", "",
        "| documents | first stage (hybrid) | shipped default (cmc-fusion) | this model |", "|---|---|---|---|",
        _row("held out of training: unseen", m["heldout_documents"]),
        _row("trained on: seen", m["training_documents"]), "",
        "Pseudo-queries are not real queries: these numbers select and guard the model; its quality on real queries "
        "is what `sieve eval` measures where labels exist (RESULTS.md).", ""])
