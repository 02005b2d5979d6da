"""Sieve's document index: corpus readers, versioned on-disk index, FAISS search."""
from __future__ import annotations

from .builder import build_index
from .changes import add_documents, apply_changes, delete_documents
from .compaction import add_store, compact, merge_if_due
from .corpus import Document, corpus_hash, read_beir_corpus, read_qrels, read_queries
from .encoder import DocumentEncoder
from .errors import (IndexDiskFullError, IndexFormatError, IndexMismatchError, IndexNotFoundError,
                     UnknownDocumentError)
from .manifest import FORMAT_VERSION, Manifest, check_manifest
from .search_index import SearchIndex
from .vectors import build_faiss, to_device

__all__ = [
    "Document", "corpus_hash", "read_beir_corpus", "read_qrels", "read_queries",
    "DocumentEncoder", "IndexFormatError", "IndexMismatchError", "IndexNotFoundError",
    "UnknownDocumentError", "IndexDiskFullError", "FORMAT_VERSION", "Manifest", "check_manifest",
    "build_index", "add_documents", "delete_documents", "add_store", "SearchIndex",
    "build_faiss", "to_device", "apply_changes", "compact", "merge_if_due",
]
