"""The service's writer (IndexUpdater) merges segments in its merger thread after commits: writes keep being
acknowledged, every acknowledged document stays served, and the merged version is swapped in."""
from __future__ import annotations

import time
from pathlib import Path

from sieve.index import Document, SearchIndex
from sieve.index.compaction import MergePolicy
from sieve.service.updates import IndexUpdater


def test_merger_thread_folds_segments_and_swaps_them_in(built: Path, encoder):
    searcher = type("Searcher", (), {})()
    searcher.index = SearchIndex.load(built)
    updater = IndexUpdater(searcher, built, {"primary": encoder}, lambda: SearchIndex.load(built), wait_ms=0,
                           merge_policy=MergePolicy(max_segments=3, merge_width=2))
    try:
        for i in range(8):
            result = updater.upsert([Document(f"n{i}", "", f"zebra{i} quokka")])
            assert result["upserted"] == 1
        deadline = time.monotonic() + 30
        while len(searcher.index.manifest.segments) > 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        index = searcher.index
        assert len(index.manifest.segments) <= 3 and index.size == 308
        assert all(index.has_id(f"n{i}") for i in range(8))
        _, rows = index.search(encoder.encode_queries(["zebra5 quokka"]), 1)
        assert index.ids(rows[0]) == ["n5"]
    finally:
        updater.close()
        updater.thread.join(timeout=30)
        updater.merger.join(timeout=30)
