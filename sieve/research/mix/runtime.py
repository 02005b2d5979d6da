"""Tokenise -> MixEncoder -> post-process: the MixEncoder ready to serve, train and precompute.

It implements index.DocumentEncoder (dim = k * d), so `sieve index build/add-store` stores every document's k
context embeddings, flattened, as the index store "mix". Checkpoint: a Hugging Face encoder directory (with the
[CTX] tokens in its tokenizer and its resized embedding matrix), `mixencoder.json` (MixConfig and the token names)
and `mix_head.safetensors` (the query-state projections and gates); fp16 weights, safetensors only.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from sieve.research.mix.model import MixConfig, MixEncoder, QueryStates
from sieve.models.weights import check_model_dir, offline, weights_hash

CONFIG_FILE = "mixencoder.json"
HEAD_WEIGHTS = "mix_head.safetensors"
STORE = "mix"  # the index store holding the context embeddings
FORMAT = 1


@dataclass(frozen=True)
class MixLengths:
    query_max_length: int = 64
    doc_max_length: int = 256


def load_encoder(path: str | Path) -> torch.nn.Module:
    return AutoModel.from_pretrained(str(path), local_files_only=True, add_pooling_layer=False)


def context_tokens(k: int) -> list[str]:
    return [f"[CTX{i}]" for i in range(k)]


def checkpoint_hash(path: Path) -> str:
    digest = hashlib.sha256(weights_hash(path).encode())
    for name in (CONFIG_FILE, HEAD_WEIGHTS):
        digest.update((path / name).read_bytes())
    return digest.hexdigest()


class MixRuntime:
    def __init__(self, module: MixEncoder, tokenizer, *, name: str, weights_hash: str,
                 lengths: MixLengths = MixLengths(), device: torch.device = torch.device("cpu"), batch_size: int = 32):
        self.module = module.to(device).eval()
        self.tokenizer = tokenizer
        self.name = name
        self.weights_hash = weights_hash
        self.lengths = lengths
        self.device = device
        self.batch_size = batch_size
        self.context_ids = tokenizer.convert_tokens_to_ids(context_tokens(module.cfg.contexts))
        if tokenizer.unk_token_id in self.context_ids:
            raise ValueError(f"the tokenizer of {name} lacks the context tokens {context_tokens(module.cfg.contexts)}")

    @property
    def scorer(self) -> MixEncoder:
        """The pure module, under the name the cross-encoder trainer's loop uses (training/mix_train.py)."""
        return self.module

    # -- construction and checkpoints ----------------------------------------------------------------------------
    @classmethod
    def new(cls, base: str | Path, cfg: MixConfig = MixConfig(), *, name: str = "mixencoder", **kwargs) -> "MixRuntime":
        """A trainable MixEncoder from a plain encoder directory (the packaged MiniLM by default). The k new [CTX]
        embedding rows start as copies of [CLS]'s, so each context token begins as a second sentence summary."""
        offline()
        base = check_model_dir(base)
        tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
        tokenizer.add_tokens(context_tokens(cfg.contexts), special_tokens=True)  # the same in transformers 4 and 5
        encoder = load_encoder(base)
        encoder.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        table = encoder.get_input_embeddings().weight
        with torch.no_grad():
            for token_id in tokenizer.convert_tokens_to_ids(context_tokens(cfg.contexts)):
                table[token_id] = table[tokenizer.cls_token_id]
        return cls(MixEncoder(encoder, cfg), tokenizer, name=name, weights_hash="unsaved", **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> "MixRuntime":
        offline()
        path = check_model_dir(path)
        if not (path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{path} is not a MixEncoder checkpoint (no {CONFIG_FILE}); train one with "
                                    "`sieve train mix`")
        saved = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
        if saved.get("format") != FORMAT:
            raise ValueError(f"{path / CONFIG_FILE} has format {saved.get('format')!r}; this Sieve reads {FORMAT}")
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        module = MixEncoder(load_encoder(path), MixConfig(**saved["config"]))
        head = load_file(str(path / HEAD_WEIGHTS))
        missing, unexpected = module.load_state_dict({k: v.float() for k, v in head.items()}, strict=False)
        if unexpected or any(not k.startswith("encoder.") for k in missing):
            raise ValueError(f"{path / HEAD_WEIGHTS} does not fit this MixEncoder: {unexpected or missing}")
        return cls(module, tokenizer, name=path.name, weights_hash=checkpoint_hash(path), **kwargs)

    def save(self, out_dir: str | Path, dtype: torch.dtype = torch.float16) -> None:
        """Written to a side folder, then moved in file by file: a reader never sees half a weight file."""
        out_dir = Path(out_dir)
        tmp = out_dir / ".mix.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        encoder = self.module.encoder
        half = {k: v.detach().to("cpu", dtype).contiguous() for k, v in encoder.state_dict().items()}
        encoder.save_pretrained(tmp, state_dict=half, safe_serialization=True)
        self.tokenizer.save_pretrained(tmp)
        head = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.module.state_dict().items()
                if not k.startswith("encoder.")}
        save_file(head, str(tmp / HEAD_WEIGHTS))
        config = {"format": FORMAT, "config": asdict(self.module.cfg), "context_tokens": context_tokens(self.module.cfg.contexts)}
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for file in tmp.iterdir():
            os.replace(file, out_dir / file.name)
        tmp.rmdir()

    # -- DocumentEncoder ------------------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self.module.cfg.contexts * self.module.dim

    @property
    def max_length(self) -> int:
        return self.lengths.doc_max_length

    def tokenize_candidates(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        tok, k = self.tokenizer, len(self.context_ids)
        bodies = tok(list(texts), add_special_tokens=False, truncation=True,
                     max_length=max(1, self.lengths.doc_max_length - 2 - k))["input_ids"]
        ids = [[tok.cls_token_id, *self.context_ids, *body, tok.sep_token_id] for body in bodies]
        batch = tok.pad({"input_ids": ids}, padding=True, return_tensors="pt")
        return {"input_ids": batch["input_ids"].to(self.device), "attention_mask": batch["attention_mask"].to(self.device)}

    def tokenize_queries(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.lengths.query_max_length,
                               return_tensors="pt")
        return {"input_ids": batch["input_ids"].to(self.device), "attention_mask": batch["attention_mask"].to(self.device)}

    def candidate_contexts(self, texts: Sequence[str]) -> torch.Tensor:
        """(M, k, d) with gradients (training)."""
        return self.module.encode_candidates(**self.tokenize_candidates(texts))

    def encode_documents(self, texts: Sequence[str], progress: bool = True) -> np.ndarray:
        """(N, k * d) float32 context embeddings; texts in length order so batches carry little padding."""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(texts), self.batch_size)
        with torch.inference_mode():
            for start in tqdm(starts, desc=f"encode {self.name}", unit="batch", disable=not progress):
                idx = order[start:start + self.batch_size]
                contexts = self.candidate_contexts([texts[i] for i in idx])  # (b, k, d)
                out[idx] = contexts.reshape(len(idx), -1).float().cpu().numpy()
        return out

    # -- scoring --------------------------------------------------------------------------------------------------
    def query_states(self, query: str) -> QueryStates:
        """The one query encoding a request needs."""
        with torch.inference_mode():
            return self.module.encode_query(**self.tokenize_queries([query]))

    def score_states(self, states: QueryStates, contexts: np.ndarray, chunk: int = 1024) -> np.ndarray:
        """(N, k * d) stored context embeddings -> (N,) float32 cosine scores; chunks bound memory, not results."""
        k, d = self.module.cfg.contexts, self.module.dim
        if contexts.ndim != 2 or contexts.shape[1] != k * d:
            raise ValueError(f"context embeddings must be (N, {k * d}), got {contexts.shape}")
        out = np.empty(len(contexts), dtype=np.float32)
        with torch.inference_mode():
            for s in range(0, len(contexts), chunk):
                block = torch.from_numpy(np.ascontiguousarray(contexts[s:s + chunk], dtype=np.float32))
                scores = self.module.interact(states, block.to(self.device).view(-1, k, d))  # (1, n)
                out[s:s + chunk] = scores[0].float().cpu().numpy()
        return out

    def score(self, query: str, documents: Sequence[str]) -> torch.Tensor:
        """(N,) float32 on CPU, as CrossEncoder.score: the documents are encoded now (no store)."""
        if not documents:
            return torch.empty(0)
        contexts = self.encode_documents(list(documents), progress=False)
        return torch.from_numpy(self.score_states(self.query_states(query), contexts))
