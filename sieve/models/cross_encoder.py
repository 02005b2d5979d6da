"""Cross-encoder: one logit on [CLS] for each (query, document) pair, from any local checkpoint directory."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn
from transformers import AutoTokenizer

from sieve.models import ce_tokens
from sieve.models.ce_base import PairLengths, PairScorer  # noqa: F401 (PairScorer: imported from here too)
from sieve.models.ce_heads import head_hash, load_head
from sieve.models.clip import clip_all
from sieve.models.weights import check_model_dir, offline, weights_hash


class CrossEncoder:
    """Tokenise pairs (query cut to its own budget first, then the document fills the rest) -> PairScorer."""

    def __init__(self, scorer: PairScorer, tokenizer, *, name: str, weights_hash: str,
                 lengths: PairLengths = PairLengths(), device: torch.device = torch.device("cpu"),
                 batch_size: int = 16):
        self.scorer = scorer.to(device).eval()
        self.tokenizer = tokenizer
        self.name = name
        self.weights_hash = weights_hash
        self.lengths = lengths
        self.device = device
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(cls, path: str | Path, *, lengths: PairLengths = PairLengths(),
                        device: torch.device = torch.device("cpu"), batch_size: int = 16) -> "CrossEncoder":
        """Any variant: the checkpoint's sieve_head.json picks the head (models/ce_heads.py; none = "cls")."""
        offline()
        path = check_model_dir(path)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return cls(load_head(path, tokenizer), tokenizer, name=path.name,
                   weights_hash=head_hash(path, weights_hash(path)), lengths=lengths, device=device,
                   batch_size=batch_size)

    def tokenize_pairs(self, query: str | Sequence[str], documents: Sequence[str]) -> dict[str, torch.Tensor]:
        queries = [query] * len(documents) if isinstance(query, str) else list(query)
        if hasattr(self.scorer, "mark_texts"):  # a head that reads marker tokens (emb) adds them to the texts
            queries, documents = self.scorer.mark_texts(queries, documents)
        tok, max_length = self.tokenizer, self.lengths.max_length
        queries, documents = clip_all(queries, self.lengths.query_max_length), clip_all(documents, max_length)
        if hasattr(self.scorer, "pair_inputs"):  # a head with its own pair layout (gated)
            query_ids = ce_tokens.query_ids(tok, queries, self.lengths.query_max_length)
            return self.pairs_from_ids(query_ids, ce_tokens.document_ids(tok, documents, self.document_room(query_ids)))
        # the tokenizer's own pair layout ([CLS] q [SEP] d [SEP] for BERT), the document cut to fit
        batch = tok(self.cut_queries(queries), documents, truncation="only_second", max_length=max_length,
                    padding=True, return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    def pairs_from_ids(self, query_ids: Sequence[list[int]], document_ids: Sequence[list[int]]) -> dict[str, torch.Tensor]:
        """A pair_inputs head's batch from token ids (the query's, the document's: models/ce_tokens.py), one pair per
        (query_ids[i], document_ids[i]): what tokenize_pairs gives for the texts those ids came from."""
        batch = self.scorer.pair_inputs(self.tokenizer, list(query_ids), list(document_ids), self.lengths.max_length)
        return {k: v.to(self.device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    def document_room(self, query_ids: Sequence[list[int]]) -> list[int] | int:
        """How many tokens of each pair's document its head reads after that pair's query (`doc_budget` of a head
        that lays out its own pairs), else max_length for every pair: how far a document's text is worth tokenizing
        (the same tensors: pair_inputs cuts there itself; 0.89-0.92x the CPU of a /rerank's pairs of SciFact abstracts:
        docs/performance.md)."""
        budget = getattr(self.scorer, "doc_budget", None)
        if budget is None:
            return self.lengths.max_length
        return [budget(len(q), self.lengths.max_length) for q in query_ids]

    def cut_queries(self, queries: list[str]) -> list[str]:
        """Each query cut after its query_max_length-th token (at that token's last character), so the pair call
        gives the query its own budget and cuts only the document (transformers 5 has no prepare_for_model)."""
        unique = list(dict.fromkeys(queries))  # one query for every document, usually: tokenized once
        spans = self.tokenizer(unique, add_special_tokens=False, truncation=True,
                               max_length=self.lengths.query_max_length, return_offsets_mapping=True)["offset_mapping"]
        cut = {q: q[:s[-1][1]] if s else q for q, s in zip(unique, spans)}
        return [cut[q] for q in queries]

    def score(self, query: str, documents: Sequence[str]) -> torch.Tensor:
        """(N,) float32 logits on CPU, documents scored in batches in length order."""
        return self.batched(query, documents, self.scorer, ())

    @property
    def part_names(self) -> tuple[str, ...]:
        """The separately trained parts of a sum-of-parts head (gated: cls, cos), else ()."""
        return tuple(getattr(self.scorer, "part_names", ()))

    def score_parts(self, query: str, documents: Sequence[str]) -> torch.Tensor:
        """(N, P) float32 on CPU: each part of a sum-of-parts head, columns in `part_names` order; the row sums are
        score()'s scores. A head without parts is refused."""
        if not self.part_names:
            raise ValueError(f"{self.name}: its cross-encoder head has no separately trained parts to score")
        return self.batched(query, documents, lambda **batch: torch.stack(self.scorer.parts(**batch), dim=-1),
                            (len(self.part_names),))

    def batched(self, query: str, documents: Sequence[str], forward, width: tuple[int, ...]) -> torch.Tensor:
        """forward(**pair inputs) -> (B, *width) over the documents in batches, longest first (less padding)."""
        order = sorted(range(len(documents)), key=lambda i: -len(documents[i]))
        out = torch.empty((len(documents), *width), dtype=torch.float32)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                out[idx] = forward(**self.tokenize_pairs(query, [documents[i] for i in idx])).float().cpu()
        return out
