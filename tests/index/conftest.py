"""Fixtures for index tests: a deterministic fake encoder and synthetic corpora."""
from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pytest

from sieve.index import Document, build_index

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@dataclass
class FakeEncoder:
    """Hashed bag of words: each token maps to a fixed Gaussian vector; sum, normalise.

    Real-valued token vectors make score ties between distinct documents
    practically impossible, so rankings can be compared exactly.
    """
    name: str = "fake-bow"
    dim: int = 32
    max_length: int = 128
    seed: int = 0
    calls: int = 0
    texts_seen: int = 0
    _vectors: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def weights_hash(self) -> str:
        return hashlib.sha256(f"{self.name}:{self.seed}:{self.dim}".encode()).hexdigest()

    def _token(self, tok: str) -> np.ndarray:
        if tok not in self._vectors:
            digest = hashlib.blake2b(f"{self.seed}:{tok}".encode(), digest_size=8).digest()
            rng = np.random.default_rng(int.from_bytes(digest, "little"))
            self._vectors[tok] = rng.standard_normal(self.dim).astype(np.float32)
        return self._vectors[tok]

    def encode_documents(self, texts: Sequence[str], progress: bool = True) -> np.ndarray:
        self.calls += 1
        self.texts_seen += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for tok in text.lower().split()[: self.max_length]:
                out[i] += self._token(tok)
            norm = np.linalg.norm(out[i])
            if norm > 0:
                out[i] /= norm
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode_documents(texts)


def make_docs(n: int, seed: int = 0, prefix: str = "d") -> list[Document]:
    """n distinct random documents over a 400-word vocabulary; every 5th has no title."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(400)]
    docs = []
    for i in range(n):
        title = "" if i % 5 == 0 else " ".join(rng.choices(vocab, k=2))
        text = " ".join(rng.choices(vocab, k=rng.randint(8, 16)))
        docs.append(Document(f"{prefix}{i}", title, text))
    return docs


@pytest.fixture
def encoder() -> FakeEncoder:
    return FakeEncoder()


@pytest.fixture
def docs() -> list[Document]:
    return make_docs(300)


@pytest.fixture
def built(tmp_path: Path, docs: list[Document], encoder: FakeEncoder) -> Path:
    """A flat float32 index over `docs`, version 1."""
    out = tmp_path / "idx"
    build_index(docs, encoder, out, progress=False)
    return out


@pytest.fixture
def scifact_dir() -> Path:
    path = DATA_DIR / "scifact"
    if not (path / "corpus.jsonl").is_file():
        if os.environ.get("CI"):  # CI always has the data: absence is a failure there
            pytest.fail(f"{path} is missing in CI")
        pytest.skip(f"real data not found at {path}")
    return path


@pytest.fixture
def write_lines(tmp_path: Path) -> Callable[[str, list[str]], Path]:
    def write(name: str, lines: list[str]) -> Path:
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path
    return write
