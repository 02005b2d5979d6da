"""Typed errors of the index package.

Each subclasses a builtin so that callers (the HTTP layer, the CLI) can map
them to a status code or exit message without importing this module.
"""
from __future__ import annotations

from typing import Sequence


class IndexNotFoundError(FileNotFoundError):
    """No live index in a directory (never built, or CURRENT is missing)."""


class IndexMismatchError(ValueError):
    """The index was built by a different model than the one configured."""


class IndexFormatError(IndexMismatchError):
    """The on-disk index has an unknown format version or is inconsistent.

    A subclass of IndexMismatchError because the remedy is the same:
    rebuild the index with this version of Sieve.
    """


class UnknownDocumentError(KeyError):
    """Some requested document ids are not in the index."""

    def __init__(self, ids: Sequence[str], size: int | None = None):
        self.ids = list(ids)
        shown = ", ".join(repr(i) for i in self.ids[:10])
        more = f" (and {len(self.ids) - 10} more)" if len(self.ids) > 10 else ""
        where = f" of {size} documents" if size is not None else ""
        self.message = (
            f"{len(self.ids)} unknown document id(s): {shown}{more}; "
            f"only ids present in the index{where} are allowed"
        )
        super().__init__(self.message)

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message, adding quotes.
        return self.message


class IndexDiskFullError(OSError):
    """A new version did not fit on the index's filesystem; the live version is unchanged."""


class IndexUnavailableError(ConnectionError):
    """The index is served by another system (a Qdrant cluster) that did not answer, answered too slowly or refused
    the operation; nothing of a write that fails with it was acknowledged (HTTP 503)."""
