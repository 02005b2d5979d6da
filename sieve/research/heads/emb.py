"""[emb] cross-encoder (Yadav et al. 2022, "Efficient Nearest Neighbor Search for Cross-Encoder Models using Matrix
Factorization"): the query and the document each open with a marker token, the pair is encoded jointly as usual,
and the score is the dot product of the two markers' contextualised embeddings instead of a linear head on [CLS].

The paper's argument for it: the score matrix of such a model (queries x documents) has a faster singular-value
decay than a [CLS] model's, so annCUR approximates it better from a few rows and columns.

Markers open their segments, `[CLS] [QEMB] query [SEP] [DEMB] document [SEP]`, so cutting a long document
(which happens at its end) never removes one. Checkpoint: the usual Hugging Face directory (the markers are in its
tokenizer and its resized embedding matrix; the one-logit [CLS] layer is carried along unused) plus
`sieve_head.json` = {"head": "emb", "query_token", "doc_token", "scale"}; models/ce_heads.py dispatches on it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from sieve.models.ce_base import load_classifier, register_head

HEAD_NAME = "emb"
HEAD_FILE = "sieve_head.json"
QUERY_MARKER = "[QEMB]"
DOC_MARKER = "[DEMB]"


def marker_positions(input_ids: torch.Tensor, token_id: int) -> torch.Tensor:
    """(B, L) ids -> (B,) position of `token_id` in each row, which must hold it exactly once."""
    hits = input_ids == token_id  # (B, L)
    counts = hits.sum(dim=1)  # (B,)
    if not bool((counts == 1).all()):
        raise ValueError(f"every pair must hold marker token {token_id} exactly once; counts {counts.tolist()}")
    return hits.int().argmax(dim=1)


class EmbPairScorer(nn.Module):
    """Pure module: pair token ids in, score = scale * <h[QEMB], h[DEMB]> out (the call every head shares).

    `classifier` is the sequence-classification transformer every head wraps; only its encoder runs here."""

    def __init__(self, classifier: nn.Module, query_token_id: int, doc_token_id: int, spec: dict):
        super().__init__()
        self.classifier = classifier
        self.query_token_id = query_token_id
        self.doc_token_id = doc_token_id
        self.spec = dict(spec)
        self.scale = float(spec["scale"])

    def marker_embeddings(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The contextualised query and document embeddings of each pair: two (B, d) tensors."""
        hidden = self.classifier.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                            token_type_ids=token_type_ids).last_hidden_state  # (B, L, d)
        rows = torch.arange(len(input_ids), device=input_ids.device)  # (B,)
        query = hidden[rows, marker_positions(input_ids, self.query_token_id)]  # (B, d)
        doc = hidden[rows, marker_positions(input_ids, self.doc_token_id)]  # (B, d)
        return query, doc

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        query, doc = self.marker_embeddings(input_ids, attention_mask, token_type_ids)
        return self.scale * (query * doc).sum(dim=-1)  # (B,)

    def mark_texts(self, queries: Sequence[str], documents: Sequence[str]) -> tuple[list[str], list[str]]:
        """Texts as the tokenizer must see them: each opened by its marker. A marker typed inside a user's text
        would be a second one, so any are blanked first."""
        markers = (self.spec["query_token"], self.spec["doc_token"])

        def clean(text: str) -> str:
            for m in markers:
                text = text.replace(m, " ")
            return text

        return ([f"{markers[0]} {clean(q)}" for q in queries], [f"{markers[1]} {clean(d)}" for d in documents])

    def save_head(self, out_dir: str | Path) -> None:
        (Path(out_dir) / HEAD_FILE).write_text(json.dumps(self.spec, indent=2) + "\n", encoding="utf-8")


def marker_ids(tokenizer, spec: dict) -> tuple[int, int]:
    ids = tokenizer.convert_tokens_to_ids([spec["query_token"], spec["doc_token"]])
    if tokenizer.unk_token_id in ids:
        raise ValueError(f"the tokenizer lacks the marker tokens {spec['query_token']} / {spec['doc_token']}; "
                         "this checkpoint was not saved by an [emb] cross-encoder")
    return ids[0], ids[1]


def new_emb(classifier: nn.Module, tokenizer, options: dict) -> EmbPairScorer:
    """A trainable [emb] head around `classifier`: adds the markers to `tokenizer` (in place: it is the one the
    cross-encoder saves) and to the embedding matrix, whose new rows transformers draws from the old rows' mean and
    covariance (torch's seed). A classifier that already knows the markers (an [emb] --init) keeps its rows."""
    spec = {"head": HEAD_NAME, "query_token": options.get("query_token", QUERY_MARKER),
            "doc_token": options.get("doc_token", DOC_MARKER),
            # 1/sqrt(d), as in attention: the marker states of a fresh MiniLM have norms ~11.5 and dot products
            # ~100, which would start the LCE softmax saturated; a fixed positive scale changes no ranking and no
            # CUR approximation.
            "scale": float(options.get("scale", 1.0 / math.sqrt(classifier.config.hidden_size)))}
    missing = [t for t in (spec["query_token"], spec["doc_token"]) if t not in tokenizer.get_vocab()]
    if missing:
        # special AddedTokens, never split or lowercased; add_tokens is spelled the same in transformers 4 and 5
        # (add_special_tokens's keyword and its "additional_special_tokens" key were renamed in 5)
        tokenizer.add_tokens(missing, special_tokens=True)
        classifier.resize_token_embeddings(len(tokenizer))
    return EmbPairScorer(classifier, *marker_ids(tokenizer, spec), spec)


def load_emb(path: Path, spec: dict, tokenizer) -> EmbPairScorer:
    return EmbPairScorer(load_classifier(path), *marker_ids(tokenizer, spec), spec)


register_head("emb", new_emb, load_emb)
