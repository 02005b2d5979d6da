"""Makes an index's adapted CMC the way `sieve adapt` publishes one (sieve/index/adapted.py): a shared-mode CMC with
non-identity layers saved with towers_from_base, its documents.txt, published into the index's store (a local
index's DIR/adapted/aNNNNNN, or a Qdrant collection's); and the demo corpus as a Qdrant collection."""
from __future__ import annotations

import hashlib
from pathlib import Path

from sieve.index import read_beir_corpus
from sieve.index.adapted import DOCUMENTS, AdaptedStore, LocalAdapted
from sieve.index.qdrant_backend import QdrantConfig
from sieve.index.qdrant_build import build_qdrant
from sieve.models.cmc import CMC, CMCConfig, randomize_gates
from sieve.models.cmc_checkpoint import CMCBundle, save_cmc
from tests.conftest import DEMO_CORPUS


NAME = "cmc-adapted"  # one name for every version, as `sieve adapt` gives them: versions differ by their weights


def publish_adapted(index: Path | AdaptedStore, biencoder, ids: list[str], seed: int,
                    base_model_hash: str | None = None) -> Path:
    """A new adapted CMC of `index` (a local index directory, or any index's AdaptedStore) that saw `ids`; `seed`
    picks its layers (two seeds score differently); `base_model_hash`: the bi-encoder it claims to be trained on
    (default: `biencoder`'s)."""
    store = index if isinstance(index, AdaptedStore) else LocalAdapted(index)
    cfg = CMCConfig(dim=biencoder.dim, n_layers=1)  # the paper CMC: its gates change the scores (an evidence CMC
    # with no evidence weights trained scores by first-stage position alone, whatever its gates)
    model = randomize_gates(CMC(cfg).eval(), scale=1.0, seed=seed)
    bundle = CMCBundle(cfg, model, biencoder, None, NAME, base_model_hash or biencoder.weights_hash)
    work = store.new_work_dir()
    metadata = {"adapted": {"corpus_hash": "test", "documents": len(ids), "generator": "tests",
                            "created": f"2026-11-25T09:{seed:02d}:00Z"}}
    save_cmc(bundle, work, metadata=metadata, towers_from_base=True)
    (work / DOCUMENTS).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    return store.publish(work)


def build_collection(path: Path, biencoder, cache_dir, engine: str = "edge") -> None:
    """The demo corpus as collection "demo" (closed again: one process holds a local-mode folder or edge shard)."""
    build_qdrant(read_beir_corpus(DEMO_CORPUS), {"primary": biencoder}, QdrantConfig(str(path), "demo", engine=engine),
                 cache_dir=cache_dir, progress=False).close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
