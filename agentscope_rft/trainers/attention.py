"""Training attention for padded batches on CPU: grouped-query heads without copies.

transformers' `sdpa` attention expands the keys and values of a grouped-query model to one copy
per query head (`repeat_kv`) whenever an attention mask is given, and a padded training batch
always has one. The copies are kept for backward in every layer: for SmolLM2 (9 query heads, 3
key/value heads) 3x the K/V memory, ~45 MB per layer for a quickstart micro-batch whose rows
attend to a 376-token shared prefix. torch's CPU flash-attention kernel takes the mask and the
grouped heads together (`enable_gqa`), with identical results. On CUDA the mask with grouped
heads would fall back to the math kernel (a [b, h, t, t] score matrix), so CUDA keeps `sdpa`.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "agentscope_rft_gqa_sdpa"


def gqa_sdpa(
    module: torch.nn.Module,
    query: Tensor,  # [b, h, t, d]
    key: Tensor,  # [b, kv, s, d]
    value: Tensor,  # [b, kv, s, d]
    attention_mask: Tensor | None,  # [b, 1, t, s] bool, or None (causal)
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """`sdpa` with grouped key/value heads passed as they are (no per-query-head copies)."""
    causal = query.shape[2] > 1 and attention_mask is None and (is_causal is not False)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None  # [b, t, h, d]


def use_training_attention(model: PreTrainedModel, device: torch.device) -> bool:
    """Switch a CPU model on `sdpa` to `gqa_sdpa`; True when switched."""
    if device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(NAME, gqa_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
