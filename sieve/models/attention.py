"""Attention for bf16/fp16 inference on a CPU: chunked matmul + softmax instead of torch's fused CPU kernel.

torch's `scaled_dot_product_attention` CPU kernel runs bf16 no faster than fp32 (this machine, AVX-512 BF16, torch
2.13: 2.6 ms bf16 vs 2.3 ms fp32 for one CMC layer at K=512), while bf16 matmuls run ~4x fp32. Written as two
batched matmuls and a softmax, in chunks small enough for the scores to stay in cache, the same attention runs
1.8-2.8x faster in bf16 (CMC layer at K=512 and B=8: 7.9 vs 21.9 ms; a MiniLM cross-encoder layer at 32 pairs x
256 tokens: 14.0 vs 25.1 ms). The scores are rounded to the input dtype (the fused kernel keeps them in fp32): the
lowered stages' rank guard (models/precision.py) is what decides whether a stage keeps the result.

`LowPrecisionAttention` is a torch function mode: inside it, every `F.scaled_dot_product_attention` call on bf16/fp16
CPU tensors (no dropout, not causal) over at least MIN_KEYS keys takes this path, whoever makes the call (CMC's layers
or a Hugging Face BERT); anything else goes to torch's kernel unchanged. Below MIN_KEYS torch's kernel is as fast
(both under 0.1 ms a call), and the mode itself costs ~0.45 ms per MiniLM forward (a Python hook on every torch call),
so a short-input module (the query tower) is better served without it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

LOW_PRECISION = (torch.bfloat16, torch.float16)
CHUNK_SCORES = 1 << 22  # attention scores computed at once (chunk of batch x heads x query rows x keys): 8 MB in bf16
MIN_KEYS = 128  # shorter attention stays with torch's kernel


def chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                      scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for q (B, H, Lq, E), k (B, H, Lk, E), v (B, H, Lk, Ev); attn_mask broadcastable
    to (B, H, Lq, Lk): bool (True = attend) or additive float. Computed in chunks of whole batch rows, and of query
    rows when one batch row alone exceeds CHUNK_SCORES."""
    B, H, Lq, E = q.shape
    Lk = k.shape[-2]
    scale = E ** -0.5 if scale is None else scale
    per_row = H * Lq * Lk
    batch_step = max(1, CHUNK_SCORES // per_row)
    row_step = Lq if per_row <= CHUNK_SCORES else max(1, CHUNK_SCORES // (H * Lk))
    chunks = []
    for b in range(0, B, batch_step):
        bs = slice(b, b + batch_step)
        keys_t = k[bs].transpose(-1, -2).contiguous()  # (b, H, E, Lk), once for all query rows
        rows = []
        for r in range(0, Lq, row_step):
            rs = slice(r, r + row_step)
            scores = torch.matmul(q[bs, :, rs] * scale, keys_t)  # (b, H, rows, Lk)
            if attn_mask is not None:
                mask = attn_mask[bs] if attn_mask.dim() == 4 and attn_mask.shape[0] == B else attn_mask
                mask = mask[..., rs, :] if mask.dim() >= 2 and mask.shape[-2] == Lq else mask
                scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
            rows.append(torch.matmul(torch.softmax(scores, dim=-1), v[bs]))  # (b, H, rows, Ev)
        chunks.append(rows[0] if len(rows) == 1 else torch.cat(rows, dim=2))
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=0)


class LowPrecisionAttention(TorchFunctionMode):
    """Routes bf16/fp16 CPU `scaled_dot_product_attention` calls to `chunked_attention` (see the module doc)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v, *rest = args
            options = dict(zip(("attn_mask", "dropout_p", "is_causal", "scale"), rest), **kwargs)
            if (q.device.type == "cpu" and q.dtype in LOW_PRECISION and not options.get("dropout_p")
                    and not options.get("is_causal") and not options.get("enable_gqa") and q.dim() == 4
                    and k.shape[:2] == q.shape[:2] and k.shape[-2] >= MIN_KEYS):
                return chunked_attention(q, k, v, options.get("attn_mask"), options.get("scale"))
        return func(*args, **kwargs)
