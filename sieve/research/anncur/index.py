"""annCUR's offline side (Yadav et al. 2022): an index of item embeddings made from a cross-encoder's own scores.

`build_anncur_index` scores k_q anchor queries against every document of a main index (R_anc, resumable, see
index/score_matrix.py), picks k_i anchor items, sets E = (pinv(C_anc) @ R_anc).T (index/cur.py) and writes E as
an index version of its own: the same layout, manifest and atomic switch as the main index (manifest model =
the cross-encoder, dim = k_i), plus `anncur.json` (anchors, cross-encoder identity and pair lengths, the main
index it was built from). Rows are the main index's rows in its order, so ids, documents and stage code are shared;
the corpus hash ties the two together and a changed main index is detected at query time.

R_anc does not depend on k_i or on the anchor items, so it is kept (`<out>/r_anc/` by default) and a rebuild with
other anchors costs no cross-encoder call.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from sieve.index.layout import rebuild_version_number, version_name, versions_dir, writer_lock
from sieve.index.manifest import FORMAT_VERSION, Manifest
from sieve.index.search_index import SearchIndex
from sieve.index.segments import new_segment_spec
from sieve.index.vectors import resolve_params, segment_ann, segment_params
from sieve.index.writer import LiveVersion, Rows, SegmentPlan, VersionPlan, finish_manifest, write_version
from sieve.research.anncur.cur import DEFAULT_RCOND, item_embeddings, select_anchor_items
from sieve.research.anncur.score_matrix import score_matrix, scorer_identity

ANNCUR_FILE = "anncur.json"


@dataclass(frozen=True)
class AnnCURConfig:
    k_i: int = 64  # anchor items: cross-encoder calls per query at search time
    anchor_method: str = "random"  # "random" (seeded) or "top" (see index/cur.py)
    seed: int = 0
    rcond: float = DEFAULT_RCOND
    faiss_kind: str = "flat"
    faiss_params: dict | None = None
    chunk: int = 4  # anchor queries per resumable R_anc chunk


def fit_error(r_anc: np.ndarray, anchors: np.ndarray, emb: np.ndarray) -> float:
    """||C_anc E^T - R_anc|| / ||R_anc||: how well the anchor items reproduce the anchor queries' own rows."""
    approx = r_anc[:, anchors].astype(np.float64) @ emb.T.astype(np.float64)
    return float(np.linalg.norm(approx - r_anc) / max(np.linalg.norm(r_anc), 1e-12))


def build_anncur_index(main_index_dir: str | Path, cross_encoder, anchor_queries: dict[str, str],
                       out_dir: str | Path, cfg: AnnCURConfig = AnnCURConfig(), *, work_dir: str | Path | None = None,
                       progress: bool = True) -> tuple[Manifest, dict]:
    """Returns the new version's manifest and its anncur.json record."""
    main_index_dir, out_dir = Path(main_index_dir), Path(out_dir)
    live = LiveVersion.open(main_index_dir)
    docs = live.docs()
    params = resolve_params(cfg.faiss_kind, cfg.faiss_params, len(docs))  # cheap checks before hours of scoring
    if not anchor_queries:
        raise ValueError("no anchor queries: annCUR needs k_q >= 1 queries (training queries or a query log)")
    if not 1 <= cfg.k_i <= min(len(docs), len(anchor_queries)):
        raise ValueError(f"k_i {cfg.k_i} must be in 1..min(documents {len(docs)}, anchor queries {len(anchor_queries)})")
    r_anc, timing = score_matrix(cross_encoder, list(anchor_queries.values()), [d.full_text for d in docs],
                                 work_dir or out_dir / "r_anc", chunk=cfg.chunk, progress=progress)
    anchors = select_anchor_items(len(docs), cfg.k_i, method=cfg.anchor_method, seed=cfg.seed, r_anc=r_anc)
    emb = item_embeddings(r_anc, anchors, cfg.rcond)  # (N, k_i)
    record = {"format_version": 1, "k_q": len(anchor_queries), "k_i": cfg.k_i, "anchor_method": cfg.anchor_method,
              "seed": cfg.seed, "rcond": cfg.rcond, "anchor_rows": anchors.tolist(),
              "anchor_ids": [docs[r].id for r in anchors], "anchor_query_ids": list(anchor_queries),
              "cross_encoder": scorer_identity(cross_encoder),
              "main_index": {"dir": str(main_index_dir), "version": live.manifest.version,
                             "corpus_hash": live.manifest.corpus_hash},
              "r_anc": {"pairs": int(r_anc.size), "pairs_scored": timing["pairs"], "seconds": timing["seconds"]},
              "anchor_query_fit_error": fit_error(r_anc, anchors, emb)}
    manifest = Manifest(format_version=FORMAT_VERSION, model_name=cross_encoder.name,
                        model_hash=cross_encoder.weights_hash, dim=cfg.k_i, count=0, dtype="float32",
                        faiss_kind=cfg.faiss_kind, faiss_params=params, corpus_hash="", created="", version=0)
    return write_anncur_version(out_dir, manifest, docs, emb, record), record


def write_anncur_version(out_dir: Path, manifest: Manifest, docs, emb: np.ndarray, record: dict) -> Manifest:
    out_dir.mkdir(parents=True, exist_ok=True)
    side = out_dir / f".{ANNCUR_FILE}.{secrets.token_hex(6)}"
    side.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    try:
        with writer_lock(out_dir):
            finish_manifest(manifest, docs, rebuild_version_number(out_dir))
            ann = segment_ann(manifest.faiss_kind, manifest.faiss_params, len(docs), whole=True)
            manifest.segments = [new_segment_spec(version_name(manifest.version), len(docs), ann)]
            segment = SegmentPlan(docs, {None: Rows(emb.shape, lambda: [emb])}, ann,
                                  segment_params(manifest.faiss_kind, manifest.faiss_params, len(docs)))
            return write_version(out_dir, VersionPlan(manifest, segment, extra_files={ANNCUR_FILE: side}))
    finally:
        side.unlink(missing_ok=True)


class AnnCURIndex:
    """A loaded annCUR index: the item embeddings (FAISS), the anchors and their texts, the build record."""

    def __init__(self, index: SearchIndex, record: dict):
        self.index = index
        self.record = record
        self.anchor_rows = np.asarray(record["anchor_rows"], dtype=np.int64)
        self.anchor_texts = [doc.full_text for doc in index.documents(self.anchor_rows)]
        self.corpus_hash = index.manifest.corpus_hash
        self.k_i = len(self.anchor_rows)

    @classmethod
    def load(cls, index_dir: str | Path, *, model_hash: str | None = None, use_gpu: bool = False,
             nprobe: int = 16, ef_search: int = 128) -> "AnnCURIndex":
        """`model_hash`: the cross-encoder that will score queries must be the one that built the index."""
        index = SearchIndex.load(index_dir, model_hash=model_hash, use_gpu=use_gpu, nprobe=nprobe, ef_search=ef_search)
        path = versions_dir(Path(index_dir)) / version_name(index.version) / ANNCUR_FILE
        if not path.is_file():
            index.close()
            raise ValueError(f"{index_dir} is not an annCUR index (no {ANNCUR_FILE}); build one with `sieve index anncur`")
        return cls(index, json.loads(path.read_text(encoding="utf-8")))

    def search(self, anchor_scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(k_i,) exact scores of one query against the anchor items -> approximate top-k (scores, rows)."""
        assert anchor_scores.shape == (self.k_i,), anchor_scores.shape
        scores, rows = self.index.search(anchor_scores[None, :].astype(np.float32), k)
        return scores[0], rows[0]

    def close(self) -> None:
        self.index.close()


def pick_anchor_queries(queries: dict[str, str], k_q: int, seed: int = 0,
                        only: Sequence[str] | None = None) -> dict[str, str]:
    """A seeded sample of k_q queries (all of them when fewer), from `only` ids when given (e.g. a train split)."""
    allowed = None if only is None else set(only)
    ids = sorted(q for q in queries if allowed is None or q in allowed)
    if k_q < len(ids):
        ids = sorted(np.random.default_rng(seed).choice(ids, size=k_q, replace=False).tolist())
    return {q: queries[q] for q in ids}
