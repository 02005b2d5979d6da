"""The serving core's stages, one module each; importing this package registers them (sieve/pipeline/registry.py).

    be      bi-encoder + FAISS maximum inner-product search (retriever)
    bm25    BM25 over the index's lexical part (retriever)
    hybrid  reciprocal-rank fusion of be and bm25 (retriever; the default on an index with a lexical part)
    cmc     CMC: candidates scored in the context of each other (reranker)
    ce      the cross-encoder over the head of the list (cross_encoder)

Research stages (annCUR, MixEncoder, the late-interaction cross-encoder) live in sieve.research and register
themselves through the `sieve.plugins` entry-point group (sieve/plugins.py); the core never imports them.
"""
from sieve.stages import be, bm25, hybrid, cmc, ce  # noqa: F401 (each registers its StageSpec)
