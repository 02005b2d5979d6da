"""Sieve: online multi-stage retrieval (bi-encoder + BM25 first stage, CMC, optional cross-encoder).

Packages: `sieve.models` (pure model code), `sieve.index` (the on-disk index), `sieve.pipeline` (stages and the
searcher), `sieve.service` (HTTP), `sieve.training`, `sieve.evaluation`, `sieve.checkpoints` (shipped weights);
`sieve.cli` is the one module that imports them all.
"""
__version__ = "0.1.0"
