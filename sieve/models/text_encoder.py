"""Tokenise -> forward -> post-process around a SentenceEncoder: the runtime side of a text tower.

Batching and length-sorting live here, not in the model, so the model stays a pure tensor function.
"""
from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from sieve.models.biencoder import SentenceEncoder
from sieve.models.buckets import bucket_tokens
from sieve.models.clip import CHARS_PER_TOKEN, clip_all, clip_chars
from sieve.models.device import DeviceRuntime, own_stream, run_graphed
from sieve.models.plain_text import PlainFirst
from sieve.models.weights import check_model_dir, offline, weights_hash


COUNTED_TOKENS = 4096  # count_tokens reads a text's first this many tokens' worth of characters (models/clip.py)


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
        # encodes queries; start-up may swap in a lower-precision copy (models/precision_stages.py)
        self.query_module = self.module
        # encodes documents (index build, live writes); start-up may swap in a lower-precision copy that passed its
        # guard (precision_stages.lower_document_tower); doc_precision names it, and is part of the embedding cache key
        self.doc_module, self.doc_precision = self.module, "fp32"
        self.tokenizer = tokenizer
        self.name = name
        self.weights_hash = weights_hash
        self.lengths = lengths
        self.device = device
        self.batch_size = batch_size
        self.counter = token_counter(tokenizer)
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

    def count_tokens(self, text: str, at_most: int = COUNTED_TOKENS) -> int:
        """Tokens of `text`, counted over its first `at_most` tokens' worth of characters (models/clip.py). Every
        request counts its query before the batcher tokenizes it: the count runs on a private copy of the fast
        tokenizer's backend (no lock shared with the batch workers, no transformers wrapper per call)."""
        text = clip_chars(text, at_most)
        if self.counter is not None:
            return len(self.counter.encode(text, add_special_tokens=True).ids)
        return len(self.tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"])

    def tokenize(self, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
        """The tokenizer's padded, truncated batch. A fast tokenizer's comes from a private copy truncating at
        max_length (`private_copy`: no lock held, plain ASCII texts without the normaliser's Unicode work), padded
        here to the longest as the tokenizer pads (tests/models/test_plain_text.py)."""
        texts = clip_all(texts, max_length)
        fast = private_copy(self.tokenizer, max_length) if texts else None
        if fast is None:
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            return {"input_ids": batch["input_ids"].to(self.device), "attention_mask": batch["attention_mask"].to(self.device)}
        ids = [e.ids for e in fast.encode_batch(texts, add_special_tokens=True)]
        input_ids, mask = self.padded(ids)
        return {"input_ids": torch.from_numpy(input_ids).to(self.device), "attention_mask": torch.from_numpy(mask).to(self.device)}

    def padded(self, ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(B, longest) token ids padded as the tokenizer pads (its pad id, on its padding side) and the mask."""
        counts = [len(row) for row in ids]
        width = max(counts, default=0)
        input_ids = np.full((len(ids), width), self.tokenizer.pad_token_id or 0, dtype=np.int64)  # (B, L)
        mask = np.zeros((len(ids), width), dtype=np.int64)  # (B, L)
        left = self.tokenizer.padding_side == "left"
        for row, (tokens, n) in enumerate(zip(ids, counts)):
            at = slice(width - n, width) if left else slice(0, n)
            input_ids[row, at], mask[row, at] = tokens, 1
        return input_ids, mask

    def tokenize_counted(self, texts: Sequence[str], max_length: int) -> tuple[dict[str, torch.Tensor], list[int]]:
        """`tokenize(texts, max_length)` and each text's `count_tokens`, tokenizing once: the token counter's batch
        call (Rust, without the interpreter lock) gives every text's ids untruncated; when all fit in max_length
        they are the ids the tokenizer would give, padded here as it pads (tests/models/test_tokenize_counted.py).
        Otherwise (a text over the limit or long enough to be clipped, a tokenizer without a Rust backend) the
        tokenizer's own call with its truncation, and each count as count_tokens makes it."""
        limit = max_length * CHARS_PER_TOKEN
        if self.counter is None or max_length > COUNTED_TOKENS or any(len(t) > limit for t in texts):
            return self.tokenize(texts, max_length), [self.count_tokens(t) for t in texts]
        ids = [e.ids for e in self.counter.encode_batch(list(texts))]
        counts = [len(row) for row in ids]
        if max(counts, default=0) > max_length:  # short enough not to be clipped: these are count_tokens' counts
            return self.tokenize(texts, max_length), counts
        input_ids, mask = self.padded(ids)
        return {"input_ids": torch.from_numpy(input_ids).to(self.device),
                "attention_mask": torch.from_numpy(mask).to(self.device)}, counts

    def encode_queries(self, texts: Sequence[str]) -> torch.Tensor:
        """(B, d) unit vectors on the encoder's device."""
        with torch.inference_mode(), own_stream(self.device, self.runtime.streams):
            return self.forward_queries(self.tokenize(texts, self.lengths.query_max_length))

    def encode_queries_counted(self, texts: Sequence[str]) -> list[tuple[torch.Tensor, int]]:
        """Each text's (unit vector (d,), count_tokens): what a query batcher answers (pipeline/searcher.py)."""
        batch, counts = self.tokenize_counted(texts, self.lengths.query_max_length)
        with torch.inference_mode(), own_stream(self.device, self.runtime.streams):
            return list(zip(self.forward_queries(batch), counts))

    def forward_queries(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The query module over a tokenized batch, at its bucketed shape when the runtime says so (padding rows and
        tokens masked, cut off after): (B, d)."""
        n = len(batch["input_ids"])
        if self.runtime.buckets:
            batch = bucket_tokens(batch, self.lengths.query_max_length, self.tokenizer.pad_token_id or 0)
        return run_graphed(self.query_module, self.runtime.graphs, **batch)[:n]

    def encode_documents(self, texts: Sequence[str], progress: bool = True) -> np.ndarray:
        return self.encode(texts, self.lengths.doc_max_length, progress=progress, module=self.doc_module)

    def encode(self, texts: Sequence[str], max_length: int, progress: bool = False,
               module: torch.nn.Module | None = None) -> np.ndarray:
        """(N, d) float32 from `module` (default: the fp32 module); texts sorted by length so each batch carries
        little padding, then put back in order. Each next batch is tokenized in a thread while the current one runs
        through the model (the fast tokenizer's batch call releases the interpreter lock)."""
        module = self.module if module is None else module
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        batches = [order[start:start + self.batch_size] for start in range(0, len(texts), self.batch_size)]
        tokenize = lambda idx: self.tokenize([texts[i] for i in idx], max_length)  # noqa: E731
        if len(batches) == 1:  # a live write, a probe: no thread to start
            with torch.inference_mode():
                out[batches[0]] = module(**tokenize(batches[0])).float().cpu().numpy()
            return out
        with torch.inference_mode(), ThreadPoolExecutor(1, thread_name_prefix="tokenize") as ahead:
            upcoming = ahead.submit(tokenize, batches[0]) if batches else None
            for n, idx in enumerate(tqdm(batches, desc=f"encode {self.name}", unit="batch", disable=not progress)):
                batch = upcoming.result()
                upcoming = ahead.submit(tokenize, batches[n + 1]) if n + 1 < len(batches) else None
                out[idx] = module(**batch).float().cpu().numpy()
        return out


_COPIES: dict[tuple[int, int | None], tuple[object, PlainFirst]] = {}


def private_copy(tokenizer, max_length: int | None = None) -> PlainFirst | None:
    """A private copy of a fast tokenizer's backend (token_counter's), plain ASCII texts through its twin
    (models/plain_text.py): never reconfigured, so threads call it at once without the tokenizer's lock, each call's
    Rust part outside the interpreter lock. No padding; with `max_length` it truncates there as the tokenizer's own
    call with truncation=True does (its truncation side), else not at all. One per backend and max_length, made on
    first use; None for a tokenizer without a Rust backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    found = _COPIES.get((id(backend), max_length))
    if found is None or found[0] is not backend:
        copy_ = token_counter(tokenizer)
        if max_length is not None:
            copy_.enable_truncation(max_length, strategy="longest_first",
                                    direction=getattr(tokenizer, "truncation_side", "right"))
        found = _COPIES[(id(backend), max_length)] = (backend, PlainFirst(copy_))  # the backend kept: its id is
        # not reused
    return found[1]


def token_counter(tokenizer):
    """A copy of a fast tokenizer's backend with no truncation or padding, used only to count tokens: nothing ever
    changes its settings, so threads may call it at once (the shared tokenizer's truncation and padding are set on
    every call, which is why that one needs a lock). None for a tokenizer without a Rust backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    counter = Tokenizer.from_str(backend.to_str())
    counter.no_truncation()
    counter.no_padding()
    return counter
