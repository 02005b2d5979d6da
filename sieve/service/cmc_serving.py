"""Which CMC this server serves and where it came from, how much of the live index an adapted CMC saw, and the live
swap when `sieve adapt` (or another trainer) publishes a new one into the served index's adapted store
(sieve/index/adapted.py: SIEVE_INDEX_DIR/adapted/CURRENT, or the Qdrant collection's metadata).

Load order (Settings.cmc_choices, stages/cmc.py load_first): SIEVE_CMC_PATH, else the served index's adapted CMC,
else the shipped default, else the untrained CMC; one that does not fit the bi-encoder is passed over. An adapted
CMC is only ever taken from the store of the index served (a Qdrant-backed server never reads SIEVE_INDEX_DIR).
Only without SIEVE_CMC_PATH is the store watched: the index writer thread (IndexUpdater on_check) or the Qdrant
updater (QdrantUpdater on_check) checks it on every reload and poll. A new one is loaded and lowered in that thread,
then put in place with one reference assignment (Searcher.replace_model): a request that already took the old model
finishes with it. Only then is the result-cache
fingerprint recomputed (on_swap), so a result computed by the old model is never stored under the new fingerprint.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sieve.index.adapted import AdaptedStore, adapted_documents
from sieve.models.cmc_checkpoint import CMCBundle
from sieve.models.precision_stages import lower_cmc, lower_query_tower
from sieve.service.gpu_runtime import apply_runtime
from sieve.stages.cmc import load_first

log = logging.getLogger("sieve")


@dataclass(frozen=True)
class Adapted:
    """What an adapted checkpoint says about itself: its version directory, the ids it adapted on, when."""

    version: str
    documents: frozenset[str]
    created: str | None

    @classmethod
    def read(cls, path: Path) -> "Adapted":
        try:
            meta = json.loads((path / "config.json").read_text()).get("metadata", {}).get("adapted", {})
        except (OSError, ValueError):
            meta = {}
        return cls(path.name, frozenset(adapted_documents(path)), meta.get("created"))


def source_of(bundle: CMCBundle, settings, store: AdaptedStore) -> str:
    """setting | adapted | shipped | untrained, from the settings and where the bundle was loaded from."""
    if settings.cmc_path is not None:
        return "setting"
    if bundle.path is None:
        return "untrained"
    return "adapted" if store.owns(bundle.path) else "shipped"


class ServedCMC:
    """The CMC stage's model as served: /readyz `cmc`, the coverage gauge, and the swap to a new adapted CMC."""

    def __init__(self, settings, components, on_swap: Callable[[], None] = lambda: None):
        self.settings, self.components, self.on_swap = settings, components, on_swap
        self.lock = threading.Lock()  # coverage cache
        self.store = settings.adapted_store(components.searcher.index)
        bundle = components.searcher.cmc
        self.served = (bundle, self.read_adapted(bundle))  # replaced as one: /readyz never mixes two CMCs
        # the live adapted CMC as last seen: what start-up served, or the one it passed over (None: none, or the
        # store could not be read at start-up: the first check looks again)
        self.watched = ((bundle.path if self.served[1] else None) or self.current() if self.watching else None)
        self.coverage_key: tuple | None = None
        self.coverage_value: dict | None = None

    @property
    def watching(self) -> bool:
        return self.settings.cmc_enabled and self.settings.cmc_path is None

    def read_adapted(self, bundle: CMCBundle | None) -> Adapted | None:
        if bundle is None or self.source(bundle) != "adapted":
            return None
        return Adapted.read(bundle.path)

    def source(self, bundle: CMCBundle) -> str:
        return source_of(bundle, self.settings, self.store)

    def current(self) -> Path | None:
        try:
            return self.store.current()
        except Exception:  # noqa: BLE001 - e.g. Qdrant down: what is served stays, the next check looks again
            log.warning("could not read the adapted CMC of %s", self.store.where, exc_info=True)
            return None

    # -- /readyz and /metrics -----------------------------------------------------------------------------------
    def status(self, index) -> dict | None:
        """/readyz `cmc` (schemas.CMCStatus) for the live index version."""
        bundle, adapted = self.served
        if bundle is None:
            return None
        return {"name": bundle.name, "source": self.source(bundle),
                "path": str(bundle.path) if bundle.path is not None else None,
                "adapted": None if adapted is None else self.coverage(adapted, index)}

    def coverage(self, adapted: Adapted, index) -> dict:
        """How many live documents the adapted CMC saw: computed once per (index version, adapted version)."""
        key = (index.version, index.size, adapted.version)
        with self.lock:
            if self.coverage_key != key:
                covered = sum(1 for doc_id in adapted.documents if index.has_id(doc_id))
                self.coverage_key = key
                self.coverage_value = {"version": adapted.version, "documents": len(adapted.documents),
                                       "live_documents": index.size, "covered": covered,
                                       "coverage": covered / index.size if index.size else 0.0,
                                       "created": adapted.created}
            return self.coverage_value

    def info(self) -> dict[str, str]:
        """The info metric sieve_cmc_info: name, source and adapted version of the served CMC."""
        bundle, adapted = self.served
        if bundle is None:
            return {"name": "", "source": "none", "version": ""}
        return {"name": bundle.name, "source": self.source(bundle),
                "version": adapted.version if adapted else ""}

    def coverage_fraction(self) -> float:
        """The gauge sieve_cmc_adapted_coverage: 0 when the served CMC is not an adapted one."""
        adapted = self.served[1]
        return self.coverage(adapted, self.components.searcher.index)["coverage"] if adapted else 0.0

    # -- the swap (index writer thread) -------------------------------------------------------------------------
    def check(self) -> bool:
        """Swap in the CMC the load order names now when the live adapted CMC changed since the last look; True =
        swapped. Raises what the store raises (the caller logs it; the next check tries again)."""
        if not self.watching:
            return False
        current = self.store.current()
        if current == self.watched:
            return False
        self.watched = current  # a checkpoint that does not fit is passed over once, not on every poll
        searcher = self.components.searcher
        fresh = load_first(self.settings.cmc_choices(current), searcher.biencoder, searcher.index)
        old = searcher.cmc
        if old is not None and (fresh.path, fresh.weights_hash) == (old.path, old.weights_hash):
            return False  # e.g. the new adapted CMC does not fit and the shipped one is served already
        kept = {k: v for k, v in self.components.precision.items() if k not in ("cmc", "cmc_query")}
        self.components.precision = kept | self.lower(fresh)  # a new dict: /readyz may be reading the old one
        biencoder = searcher.biencoder
        apply_runtime(biencoder.runtime, biencoder.device, biencoder, fresh)  # as served at start-up (gpu_runtime.py)
        searcher.replace_model("cmc", fresh)
        self.served = (fresh, self.read_adapted(fresh))
        self.on_swap()  # after the model: no result of the old model is stored under the new fingerprint
        log.info("CMC %s (%s, %s) -> %s (%s, %s)", old.name if old else None, old and self.source(old),
                 old and old.path, fresh.name, self.source(fresh), fresh.path)
        return True

    def lower(self, bundle: CMCBundle) -> dict[str, dict]:
        """The new CMC in the precision the service runs (as components.lower_precision at start-up)."""
        biencoder = self.components.searcher.biencoder
        bundle.model, choice = lower_cmc(bundle, biencoder, self.settings.precision)
        record = {"cmc": choice.as_dict()}
        if bundle.query_tower is not biencoder:  # a trained query tower of its own
            bundle.query_tower.query_module, choice = lower_query_tower(bundle.query_tower, self.settings.precision)
            record["cmc_query"] = choice.as_dict()
        return record
