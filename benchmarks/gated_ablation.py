"""What a trained gated cross-encoder (models/ce_gated.py) owes to each of its parts, on the dev split it was
selected on: the model as trained, with its [CLS] logit removed, with its cross-attention gates closed again, and
with both (what is left is the fine-tuned encoder scoring the two texts apart, like a bi-encoder). Usage:
  python benchmarks/gated_ablation.py --ce checkpoints/cross-encoder --data ../shared/data/scifact \
      --out benchmarks/results/diagnostics/gated_ablation_scifact.json
Dev is what the trainer used (NFCorpus dev, or the seeded 10% of SciFact train); the test split is not read.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sieve.models.ce_gated import GatedScorer  # noqa: E402
from sieve.models.ce_heads import trained_lengths  # noqa: E402
from sieve.models.cross_encoder import CrossEncoder  # noqa: E402
from sieve.service.components import load_biencoder  # noqa: E402
from sieve.service.config import Settings  # noqa: E402
from sieve.training.ce_train import CETrainConfig, dev_ndcg, load_dataset  # noqa: E402


def variants(ce: CrossEncoder) -> dict[str, dict]:
    """name -> the parameters to overwrite (with zeros) for that variant."""
    scorer: GatedScorer = ce.scorer
    head = scorer.classifier.classifier
    return {"trained": {}, "no [CLS] logit": {"cls": [head.weight, head.bias]},
            "gates closed": {"gates": [scorer.gates]},
            "gates closed, no [CLS] logit": {"gates": [scorer.gates], "cls": [head.weight, head.bias]}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ce", type=Path, required=True, help="a gated cross-encoder checkpoint")
    parser.add_argument("--data", type=Path, required=True, help="the BEIR folder it was trained on")
    parser.add_argument("--dev-queries", type=int, default=100)
    parser.add_argument("--k-dev", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = Settings()
    ce = CrossEncoder.from_pretrained(args.ce, lengths=trained_lengths(args.ce))
    if not isinstance(ce.scorer, GatedScorer):
        raise SystemExit(f"{args.ce} does not hold a gated cross-encoder")
    cfg = CETrainConfig(data_dirs=(args.data,), out_dir=Path("unused"), dev_queries=args.dev_queries, k_dev=args.k_dev)
    dataset = load_dataset(args.data, load_biencoder(settings, ce.device), cfg, settings.cache_dir)
    rows = {"bi-encoder": dev_ndcg(None, [dataset])[dataset.name]}
    for name, zeroed in variants(ce).items():
        saved = [(p, p.detach().clone()) for params in zeroed.values() for p in params]
        with torch.no_grad():
            for p, _ in saved:
                p.zero_()
            rows[name] = dev_ndcg(ce, [dataset])[dataset.name]
            for p, value in saved:
                p.copy_(value)
    gates = torch.tanh(ce.scorer.gates.detach())
    report = {"checkpoint": str(args.ce), "dataset": dataset.name, "split": "dev", "queries": len(dataset.dev.query_ids),
              "k_dev": args.k_dev, "ndcg@10": {k: round(v, 4) for k, v in rows.items()},
              "mean_abs_tanh_gate_per_layer": [round(float(x), 4) for x in gates.abs().mean(dim=1)],
              "max_abs_tanh_gate": round(float(gates.abs().max()), 4), "scale": round(float(ce.scorer.scale), 3)}
    print("| variant | dev nDCG@10 |\n|---|---|")
    for name, value in report["ndcg@10"].items():
        print(f"| {name} | {value} |")
    print(f"gates |tanh g| per layer: {report['mean_abs_tanh_gate_per_layer']}, max {report['max_abs_tanh_gate']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
