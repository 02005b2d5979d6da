"""Makes an index's adapted CMC the way `sieve adapt` publishes one (sieve/index/adapted.py): a shared-mode CMC with
non-identity layers saved with towers_from_base, its documents.txt, published as DIR/adapted/aNNNNNN."""
from __future__ import annotations

from pathlib import Path

from sieve.index.adapted import DOCUMENTS, new_work_dir, publish
from sieve.models.cmc import CMC, CMCConfig, randomize_gates
from sieve.models.cmc_checkpoint import CMCBundle, save_cmc


NAME = "cmc-adapted"  # one name for every version, as `sieve adapt` gives them: versions differ by their weights


def publish_adapted(index_dir: Path, biencoder, ids: list[str], seed: int, base_model_hash: str | None = None) -> Path:
    """A new adapted CMC of `index_dir` that saw `ids`; `seed` picks its layers (two seeds score differently);
    `base_model_hash`: the bi-encoder it claims to be trained on (default: `biencoder`'s)."""
    cfg = CMCConfig(dim=biencoder.dim, n_layers=1)  # the paper CMC: its gates change the scores (an evidence CMC
    # with no evidence weights trained scores by first-stage position alone, whatever its gates)
    model = randomize_gates(CMC(cfg).eval(), scale=1.0, seed=seed)
    bundle = CMCBundle(cfg, model, biencoder, None, NAME, base_model_hash or biencoder.weights_hash)
    work = new_work_dir(index_dir)
    metadata = {"adapted": {"corpus_hash": "test", "documents": len(ids), "generator": "tests",
                            "created": f"2026-11-25T09:{seed:02d}:00Z"}}
    save_cmc(bundle, work, metadata=metadata, towers_from_base=True)
    (work / DOCUMENTS).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    return publish(index_dir, work)
