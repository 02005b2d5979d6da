"""Tokenise -> forward -> post-process around a SentenceEncoder: the runtime side of a text tower.

Batching and length-sorting live here, not in the model, so the model stays a pure tensor function.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from sieve.models.biencoder import SentenceEncoder
from sieve.models.buckets import bucket_tokens
from sieve.models.clip import clip_all, clip_chars
from sieve.models.device import DeviceRuntime, own_stream, run_graphed
from sieve.models.weights import check_model_dir, offline, weights_hash


@dataclass(frozen=True)
class EncoderLengths:
    query_max_length: int = 64
    doc_max_length: int = 256


class TextEncoder:
    """A text tower ready to serve: tokenizer + SentenceEncoder on a device. Implements index.DocumentEncoder."""

    def __init__(self, module: SentenceEncoder, tokenizer, *, name: str, weights_hash: str,
                 lengths: EncoderLengths = EncoderLengths(), device: torch.device = torch.device("cpu"),
                 batch_size: int = 32):
        self.module = module.to(device).eval()
        # encodes queries; start-up may swap in a lower-precision copy (models/precision_stages.py), documents stay fp32
        self.query_module = self.module
        self.tokenizer = tokenizer
        self.name = name
        self.weights_hash = weights_hash
        self.lengths = lengths
        self.device = device
        self.batch_size = batch_size
        self.runtime = DeviceRuntime()  # how query forwards run (buckets, own CUDA stream, graphs): set at start-up

    @classmethod
    def from_pretrained(cls, path: str | Path, *, name: str | None = None, lengths: EncoderLengths = EncoderLengths(),
                        device: torch.device = torch.device("cpu"), batch_size: int = 32) -> "TextEncoder":
        offline()
        path = check_model_dir(path)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        transformer = AutoModel.from_pretrained(str(path), local_files_only=True)
        return cls(SentenceEncoder(transformer), tokenizer, name=name or path.name, weights_hash=weights_hash(path),
                   lengths=lengths, device=device, batch_size=batch_size)

    def copy(self, name: str) -> "TextEncoder":
        """An independent tower with the same weights (how CMC's towers are initialised)."""
        return TextEncoder(copy.deepcopy(self.module), self.tokenizer, name=name, weights_hash=self.weights_hash,
                           lengths=self.lengths, device=self.device, batch_size=self.batch_size)

    @property
    def dim(self) -> int:
        return self.module.dim

    @property
    def max_length(self) -> int:
        return self.lengths.doc_max_length

    def count_tokens(self, text: str, at_most: int = 4096) -> int:
        """Tokens of `text`, counted over its first `at_most` tokens' worth of characters (models/clip.py)."""
        return len(self.tokenizer(clip_chars(text, at_most), add_special_tokens=True, truncation=False)["input_ids"])

    def tokenize(self, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(clip_all(texts, max_length), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return {"input_ids": batch["input_ids"].to(self.device), "attention_mask": batch["attention_mask"].to(self.device)}

    def encode_queries(self, texts: Sequence[str]) -> torch.Tensor:
        """(B, d) unit vectors on the encoder's device."""
        with torch.inference_mode(), own_stream(self.device, self.runtime.streams):
            return self.forward_queries(self.tokenize(texts, self.lengths.query_max_length))

    def forward_queries(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The query module over a tokenized batch, at its bucketed shape when the runtime says so (padding rows and
        tokens masked, cut off after): (B, d)."""
        n = len(batch["input_ids"])
        if self.runtime.buckets:
            batch = bucket_tokens(batch, self.lengths.query_max_length, self.tokenizer.pad_token_id or 0)
        return run_graphed(self.query_module, self.runtime.graphs, **batch)[:n]

    def encode_documents(self, texts: Sequence[str], progress: bool = True) -> np.ndarray:
        return self.encode(texts, self.lengths.doc_max_length, progress=progress)

    def encode(self, texts: Sequence[str], max_length: int, progress: bool = False) -> np.ndarray:
        """(N, d) float32; texts sorted by length so each batch carries little padding, then put back in order."""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(texts), self.batch_size)
        with torch.inference_mode():
            for start in tqdm(starts, desc=f"encode {self.name}", unit="batch", disable=not progress):
                idx = order[start:start + self.batch_size]
                vectors = self.module(**self.tokenize([texts[i] for i in idx], max_length))
                out[idx] = vectors.float().cpu().numpy()
        return out
