"""In-process eval: an index of the dataset's corpus (built once, then reused) and the service's own components."""
from __future__ import annotations

import sys
from pathlib import Path

from sieve.index import (IndexMismatchError, IndexNotFoundError, SearchIndex, build_index, corpus_hash,
                   read_beir_corpus)
from sieve.index.corpus import hash_strings
from sieve.index.lexical import LexicalConfig
from sieve.pipeline import registry
from sieve.service.config import Settings


def index_is_current(index_dir: Path, docs, encoder, store_names, lexical: bool = True) -> bool:
    """Same test as `sieve demo`: the live version was built from this corpus by this model, with these stores
    (and a lexical part when `lexical`)."""
    try:
        live = SearchIndex.load(index_dir, model_name=encoder.name, model_hash=encoder.weights_hash, dim=encoder.dim)
    except (IndexNotFoundError, IndexMismatchError):
        return False
    try:
        return (live.manifest.corpus_hash == corpus_hash(docs) and all(live.has_store(n) for n in store_names)
                and live.has_lexical == lexical)
    finally:
        live.close()


def ensure_index(corpus_path: Path, encoder, index_dir: Path, cache_dir: Path | None,
                 extra_stores: dict | None = None, lexical=LexicalConfig()) -> Path:
    """Builds only when missing or stale; the embedding cache makes a rebuild of a known corpus cheap."""
    docs = read_beir_corpus(corpus_path)
    if not index_is_current(index_dir, docs, encoder, list(extra_stores or {}), lexical is not None):
        print(f"building the eval index at {index_dir} ({len(docs)} documents)", file=sys.stderr)
        build_index(docs, encoder, index_dir, cache_dir=cache_dir, extra_stores=extra_stores or None,
                    lexical=lexical)
    return index_dir


def eval_index(settings: Settings, name: str, corpus_path: Path) -> Path:
    """<cache_dir>/eval-indexes/<name>-<model key>: one index per dataset and per set of document encoders."""
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.models.device import pick_device
    from sieve.service.components import load_biencoder, lower_documents, stage_settings

    biencoder = load_biencoder(settings, pick_device(settings.device))
    lower_documents(settings, biencoder)
    extra = {}
    if settings.cmc_enabled and (cmc_path := settings.resolved_cmc_path()) is not None:
        tower = load_cmc(cmc_path, biencoder).candidate_tower  # separate mode: its own document vectors
        if tower is not None:
            extra["cmc"] = tower
    registry.load_plugins()
    for spec in registry.stages():  # stores a stage keeps in the index (the MixEncoder's context embeddings)
        if (make := spec.extra.get("eval_store")) and (store := make(settings, stage_settings(spec, settings), biencoder)):
            extra[store[0]] = store[1]
    precision = [] if biencoder.doc_precision == "fp32" else [f"documents in {biencoder.doc_precision}"]  # fp32: the key as before
    key = hash_strings([biencoder.weights_hash, *(tower.weights_hash for tower in extra.values()), *precision])[:12]
    index_dir = Path(settings.cache_dir) / "eval-indexes" / f"{name}-{key}"
    return ensure_index(corpus_path, biencoder, index_dir, settings.cache_dir, extra, settings.lexical_config())


def load_local(settings: Settings, name: str, corpus_path: Path, index_dir: Path | None = None):
    """The service's Components over `index_dir`, or over the cached eval index of the corpus when None."""
    from sieve.service.components import load_components

    index_dir = index_dir or eval_index(settings, name, corpus_path)
    return load_components(settings.model_copy(update={"index_dir": Path(index_dir)}))
