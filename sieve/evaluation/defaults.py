"""What `sieve eval` runs when not told otherwise, in a module that imports nothing (`sieve eval --help` answers at
once, without torch)."""
from __future__ import annotations

# the pipelines `sieve eval` runs when none are named (each runs only where its stages are loaded); any other
# `retriever[+reranker][+cross_encoder]` of registered stages can be named
DEFAULT_PIPELINES = ("be", "be+cmc", "be+ce", "be+cmc+ce", "anncur", "anncur+ce", "be+mix", "be+mix+ce",
                     "be+ce_late", "be+cmc+ce_late", "bm25", "hybrid", "hybrid+cmc", "hybrid+ce", "hybrid+cmc+ce")
