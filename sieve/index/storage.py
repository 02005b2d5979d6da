"""Files inside one version directory: embeddings (.npy) and documents (SQLite)."""
from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .corpus import Document

EMBEDDINGS_FILE = "embeddings.npy"
DOCS_FILE = "docs.sqlite"
FAISS_FILE = "faiss.index"
STORES_DIR = "stores"
_CHUNK_ROWS = 65536  # bounds memory when copying memory-mapped arrays


def store_path(version_dir: Path, name: str | None) -> Path:
    """Path of the primary embeddings (name None) or of an extra store."""
    if name is None:
        return version_dir / EMBEDDINGS_FILE
    return version_dir / STORES_DIR / f"{name}.npy"


def write_embeddings(path: Path, parts: Iterable[np.ndarray], shape: tuple[int, int],
                     dtype: str) -> None:
    """Write row blocks (concatenated in order) into a new .npy of `dtype`.

    Plain writes, not a memory map: on a full filesystem a write through a map is a SIGBUS that kills the
    process, a plain write is an OSError (ENOSPC) the caller can answer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dt = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": tuple(shape)}
    start = 0
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for part in parts:
            f.write(np.ascontiguousarray(part, dtype=dt).tobytes())
            start += len(part)
    if start != shape[0]:
        raise ValueError(f"wrote {start} embedding rows into {path}, expected {shape[0]}")


def open_embeddings(path: Path) -> np.memmap:
    """Read-only memory map; rows are converted to float32 by the caller."""
    return np.load(path, mmap_mode="r")


def row_chunks(array: np.ndarray, rows: np.ndarray | None = None) -> Iterable[np.ndarray]:
    """Yield float32 blocks of array[rows] (all rows if None) without loading it whole."""
    total = len(array) if rows is None else len(rows)
    for start in range(0, total, _CHUNK_ROWS):
        if rows is None:
            block = array[start:start + _CHUNK_ROWS]
        else:
            block = array[rows[start:start + _CHUNK_ROWS]]
        yield np.asarray(block, dtype=np.float32)


def write_docs(path: Path, docs: Sequence[Document]) -> None:
    """Create docs.sqlite with rows numbered 0..N-1 in the given order."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE docs (row INTEGER PRIMARY KEY, id TEXT UNIQUE, "
                     "title TEXT, text TEXT)")
        conn.executemany("INSERT INTO docs VALUES (?, ?, ?, ?)",
                         ((i, d.id, d.title, d.text) for i, d in enumerate(docs)))
        conn.commit()
    finally:
        conn.close()


def connect_readonly(path: Path) -> sqlite3.Connection:
    # Version files never change after commit, so read-only shared use is safe.
    uri = path.resolve().as_uri() + "?mode=ro"
    return sqlite3.connect(uri, uri=True, check_same_thread=False)


def read_all_docs(path: Path) -> list[Document]:
    conn = connect_readonly(path)
    try:
        rows = conn.execute("SELECT id, title, text FROM docs ORDER BY row").fetchall()
    finally:
        conn.close()
    return [Document(i, t or "", x or "") for i, t, x in rows]


def link_or_copy(src: Path, dst: Path) -> None:
    """Reuse an unchanged file in a new version; hard links are safe as files are immutable."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
