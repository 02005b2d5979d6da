"""Cross-encoder head "gated": a joint encoder that starts as the bi-encoder and learns how much to cross-attend.

Input: `[CLS] q [SEP] [CLS] d [SEP]`, each segment with its own positions (0, 1, ...) and token type 0, so each
segment is laid out exactly as the bi-encoder sees it. In every layer and head, a token attends to its own segment
with the usual softmax and to the other segment with a second softmax, added with weight tanh(g) (g per layer and
head, 0 at the start: Flamingo's gated cross-attention). score = s_cos + s_cls: s_cos = scale * cos(mean of the query
segment's last-layer states, mean of the document's), s_cls a one-logit head on the query's [CLS] (zero at the start;
it can only tell documents apart through open gates, so it learns as they open).

Why: the packaged all-MiniLM-L6-v2 is a mean-pooled bi-encoder. The plain [CLS] cross-encoder starts at chance and
the pooled-cosine one (models/ce_cos.py) starts below the bi-encoder, because joint attention changes the states it
pools; neither got past the bi-encoder in the hours this 2-core CPU gives. With every gate at 0 this module computes
the bi-encoder's own cosine (tests/models/test_ce_gated.py checks it), so training starts from the bi-encoder's
ranking and the gradient on each gate says how much the other text should be let in (d score / d g = the
cross-attention output at g = 0, not zero).

Checkpoint: the Hugging Face classifier directory plus sieve_head.json {"head": "gated"} and head.safetensors
(fp16 scale and gates); models/ce_heads.py dispatches on it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from sieve.models.ce_base import (HEAD_FILE, HEAD_WEIGHTS, INITIAL_SCALE, SumOfParts, cosine, load_classifier,
                                  masked_mean, register_head)

HEAD_NAME = "gated"


def segment_positions(segments: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) position ids that restart at 0 where the document segment (segment id 1) begins."""
    n_query = ((segments == 0) & attention_mask.bool()).sum(dim=1, keepdim=True)  # (B, 1): the query comes first
    positions = torch.arange(segments.shape[1], device=segments.device)[None, :].expand_as(segments)
    return torch.where(segments == 1, positions - n_query, positions).clamp(min=0)


class GatedScorer(SumOfParts):
    """Pure module: segment-laid-out pair ids in, one score per pair out (PairScorer's call)."""

    part_names = ("cls", "cos")

    def __init__(self, classifier: nn.Module, scale: float = INITIAL_SCALE):
        super().__init__()
        self.classifier = classifier
        config = classifier.config
        self.n_heads = config.num_attention_heads
        self.scale = nn.Parameter(torch.tensor(float(scale)))
        self.gates = nn.Parameter(torch.zeros(config.num_hidden_layers, self.n_heads))

    def head_parameters(self) -> list[nn.Parameter]:
        """Parameters the trainer steps with its own (larger) learning rate: they start at 0 / 20, not pre-trained."""
        return [self.scale, self.gates]

    @staticmethod
    def doc_budget(query_tokens: int, max_length: int) -> int:
        """How many of a document's tokens a pair of `pair_inputs` keeps after a query of `query_tokens` (without
        special tokens): the most worth tokenizing (ce_tokens.document_ids)."""
        return max(0, max_length - min(query_tokens, max(0, max_length - 6)) - 4)

    @staticmethod
    def pair_inputs(tokenizer, query_ids: list[list[int]], doc_ids: list[list[int]], max_length: int) -> dict:
        """`[CLS] q [SEP] [CLS] d [SEP]` per pair, the document cut so the pair fits max_length; token_type_ids
        carry the segment (0 query, 1 document); padded to the longest pair."""
        cls_id, sep_id, pad_id = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
        rows, segs = [], []
        for q, d in zip(query_ids, doc_ids):
            query = [cls_id, *q[:max(0, max_length - 6)], sep_id]
            doc = [cls_id, *d[:GatedScorer.doc_budget(len(q), max_length)], sep_id]
            rows.append(query + doc)
            segs.append([0] * len(query) + [1] * len(doc))
        width = max(len(r) for r in rows)
        # laid out in numpy, one tensor each at the end: a torch.tensor per row cost 15 of the 84 ms a /rerank of 100
        # spent building its pairs on a Zen 3 core
        ids = np.full((len(rows), width), pad_id, dtype=np.int64)
        segments = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, (r, s) in enumerate(zip(rows, segs)):
            ids[i, :len(r)], segments[i, :len(s)], mask[i, :len(r)] = r, s, 1
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                "token_type_ids": torch.from_numpy(segments)}

    def embed(self, input_ids: torch.Tensor, segments: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        emb = self.classifier.bert.embeddings
        positions = segment_positions(segments, attention_mask)
        x = (emb.word_embeddings(input_ids) + emb.position_embeddings(positions)
             + emb.token_type_embeddings(torch.zeros_like(input_ids)))
        return emb.dropout(emb.LayerNorm(x))

    def layer(self, index: int, h: torch.Tensor, same: torch.Tensor, cross: torch.Tensor) -> torch.Tensor:
        """One BERT layer whose attention is own-segment softmax + tanh(g) * other-segment softmax."""
        block = self.classifier.bert.encoder.layer[index]
        attn = block.attention.self
        B, T, d = h.shape
        dh = d // self.n_heads

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(B, T, self.n_heads, dh).transpose(1, 2)  # (B, H, T, dh)

        q, k, v = heads(attn.query(h)), heads(attn.key(h)), heads(attn.value(h))
        # Two fused attention calls (every row has keys in both segments: each holds at least [CLS] and [SEP]);
        # 3.5x faster on CPU than softmaxes over a materialised (B, H, T, T) score tensor.
        p = attn.dropout.p if self.training else 0.0
        own = F.scaled_dot_product_attention(q, k, v, attn_mask=same, dropout_p=p)  # (B, H, T, dh)
        other = F.scaled_dot_product_attention(q, k, v, attn_mask=cross, dropout_p=p)
        mixed = own + torch.tanh(self.gates[index])[None, :, None, None] * other
        context = mixed.transpose(1, 2).reshape(B, T, d)
        out = block.attention.output
        h = out.LayerNorm(out.dropout(out.dense(context)) + h)
        return block.output(block.intermediate(h), h)

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        """(B, T, d) last-layer states."""
        valid = attention_mask.bool()
        same_segment = segments[:, :, None] == segments[:, None, :]  # (B, T, T)
        same = (same_segment & valid[:, None, :])[:, None]  # (B, 1, T, T): query i, key j
        cross = (~same_segment & valid[:, None, :])[:, None]
        h = self.embed(input_ids, segments, attention_mask)
        for index in range(len(self.classifier.bert.encoder.layer)):
            h = self.layer(index, h, same, cross)
        return h

    def parts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(s_cls, s_cos), each (B,)."""
        if token_type_ids is None:
            raise ValueError("the gated head needs segment ids (token_type_ids) from its pair_inputs()")
        return self.score_states(self.states(input_ids, attention_mask, token_type_ids), attention_mask, token_type_ids)

    def score_states(self, states: torch.Tensor, attention_mask: torch.Tensor,
                     segments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(s_cls, s_cos) from the (B, T, d) last-layer states."""
        valid = attention_mask.bool()
        cos = cosine(masked_mean(states, valid & (segments == 0)), masked_mean(states, valid & (segments == 1)))
        pooled = self.classifier.bert.pooler(states) if self.classifier.bert.pooler is not None else states[:, 0]
        s_cls = self.classifier.classifier(self.classifier.dropout(pooled))[:, 0]
        return s_cls, self.scale * cos

    def head_tensors(self) -> dict[str, torch.Tensor]:
        """The head's own tensors as head.safetensors stores them."""
        return {"scale": self.scale.reshape(1), "gates": self.gates}

    def head_spec(self) -> dict:
        """What sieve_head.json holds."""
        return {"head": HEAD_NAME}

    def save_head(self, out_dir: Path, dtype: torch.dtype = torch.float16) -> None:
        out_dir = Path(out_dir)
        (out_dir / HEAD_FILE).write_text(json.dumps(self.head_spec(), indent=2) + "\n", encoding="utf-8")
        save_file({k: v.detach().to("cpu", dtype).contiguous() for k, v in self.head_tensors().items()},
                  str(out_dir / HEAD_WEIGHTS))

    def load_head(self, path: Path) -> None:
        saved = load_file(str(Path(path) / HEAD_WEIGHTS))
        with torch.no_grad():
            self.scale.copy_(saved["scale"].float()[0])
            self.gates.copy_(saved["gates"].float())


def zero_classifier(classifier: nn.Module) -> None:
    """Zeroes the one-logit [CLS] head, so a fresh gated head's s_cls starts at 0."""
    with torch.no_grad():
        classifier.classifier.weight.zero_()
        classifier.classifier.bias.zero_()


def new_gated(classifier: nn.Module, tokenizer, options: dict) -> GatedScorer:
    """A fresh head: gates closed and the [CLS] logit zeroed, so the first scores are the bi-encoder's (x scale)."""
    zero_classifier(classifier)
    return GatedScorer(classifier, float(options.get("scale", INITIAL_SCALE)))


def load_gated(path: Path, spec: dict, tokenizer) -> GatedScorer:
    scorer = GatedScorer(load_classifier(path))
    scorer.load_head(path)
    return scorer


register_head("gated", new_gated, load_gated)
