"""The judged queries of one BEIR split, optionally a seeded sample of them."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from sieve.index import read_qrels, read_queries


@dataclass(frozen=True)
class EvalData:
    name: str
    split: str
    data_dir: Path
    queries: dict[str, str]  # query id -> text, only queries with at least one relevant document
    qrels: dict[str, dict[str, int]]  # the same query ids -> {doc id: grade}
    ignore_identical_ids: bool = False  # drop a retrieved document whose id is the query id (BEIR: ArguAna, Quora)

    @property
    def corpus_path(self) -> Path:
        return self.data_dir / "corpus.jsonl"


# collections whose queries are documents of the corpus, so each query would find itself (BEIR's list)
IDENTICAL_ID_DATASETS = ("arguana", "quora")


def load_split(data_dir: str | Path, split: str, *, name: str | None = None, max_queries: int | None = None,
               seed: int = 0, ignore_identical_ids: bool | None = None) -> EvalData:
    """Queries without a relevant document are dropped, as mean_metric would ignore them anyway.
    ignore_identical_ids unset: on for the collections in IDENTICAL_ID_DATASETS (by folder name)."""
    data_dir = Path(data_dir)
    qrels_path = data_dir / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        found = sorted(p.stem for p in (data_dir / "qrels").glob("*.tsv"))
        raise FileNotFoundError(f"{qrels_path} not found; splits in {data_dir}: {', '.join(found) or 'none'}")
    qrels = read_qrels(qrels_path)
    texts = read_queries(data_dir / "queries.jsonl")
    judged = sorted(q for q, grades in qrels.items() if q in texts and any(g > 0 for g in grades.values()))
    if not judged:
        raise ValueError(f"{qrels_path} judges no query of {data_dir / 'queries.jsonl'} as having a relevant document")
    if max_queries is not None and max_queries < len(judged):
        judged = sorted(random.Random(seed).sample(judged, max_queries))
    if ignore_identical_ids is None:
        ignore_identical_ids = data_dir.resolve().name.lower() in IDENTICAL_ID_DATASETS
    return EvalData(name or data_dir.name, split, data_dir, {q: texts[q] for q in judged},
                    {q: qrels[q] for q in judged}, ignore_identical_ids)
