"""Tensor layout of a padded prefill batch whose rows start from cached KV (transformers'
forward: models without a fused forward; the others prefill ragged, see `fused.py`).

Row `j` of a prefill batch has `past_j` tokens whose KV is already known (cached prefix blocks,
or the chunks of a long prompt prefilled in earlier steps) and `new_j` tokens to compute. Both
parts are left-padded to the batch's longest, so a row's columns read
`[pad | past_j | pad | new_j]`; the attention mask is 0 on the pads and position ids count only
real tokens, so a row computes exactly what it would alone. The ones of a row's mask, in order,
are its token positions 0, 1, ... (`token_columns`), which is how KV is read back out of a batch
cache for the prefix cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentscope_rft.engines.kv_cache import BatchCache, GrowingLayer


@dataclass(slots=True)
class PrefillBatch:
    input_ids: torch.Tensor  # [J, S] new tokens, left-padded
    attention_mask: torch.Tensor  # [J, P + S]
    position_ids: torch.Tensor  # [J, S]
    cache: BatchCache  # holds the past: [J, H, P, D] per layer
    past_len: int  # P


def build_prefill(
    new_ids: Sequence[Sequence[int]],
    past: Sequence[torch.Tensor | None],
    num_layers: int,
    pad_id: int,
    device: torch.device,
) -> PrefillBatch:
    """Lay out rows of `new_ids` after their `past` KV (`[layers, 2, H, past_j, D]` or None).

    Example:
        >>> batch = build_prefill([[5, 6]], [None], num_layers=1, pad_id=0, device="cpu")
        >>> batch.attention_mask.tolist(), batch.past_len
        ([[1, 1]], 0)
    """
    rows = len(new_ids)
    past_lens = [0 if kv is None else kv.shape[3] for kv in past]
    longest_past = max(past_lens)
    longest_new = max(len(ids) for ids in new_ids)
    ids = torch.full((rows, longest_new), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, longest_past + longest_new), dtype=torch.long)
    positions = torch.zeros((rows, longest_new), dtype=torch.long)
    for j, (row_ids, past_len) in enumerate(zip(new_ids, past_lens, strict=True)):
        n = len(row_ids)
        ids[j, longest_new - n :] = torch.tensor(row_ids, dtype=torch.long)
        mask[j, longest_past - past_len : longest_past] = 1
        mask[j, longest_past + longest_new - n :] = 1
        positions[j, longest_new - n :] = torch.arange(past_len, past_len + n)
    cache = BatchCache(num_layers)
    if longest_past:
        template = next(kv for kv in past if kv is not None)
        layers, _, heads, _, dim = template.shape
        stacked = template.new_zeros(layers, 2, rows, heads, longest_past, dim)
        for j, kv in enumerate(past):
            if kv is not None:
                stacked[:, :, j, :, longest_past - kv.shape[3] :] = kv
        for layer, layer_cache in enumerate(cache.layers):
            assert isinstance(layer_cache, GrowingLayer)
            layer_cache.assign(
                stacked[layer, 0].to(device),
                stacked[layer, 1].to(device),
                spare=longest_new + 64,
            )
    return PrefillBatch(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        cache=cache,
        past_len=longest_past,
    )


def token_columns(mask_row: torch.Tensor) -> torch.Tensor:
    """Cache columns of a row's tokens, in position order (the ones of its attention mask)."""
    return mask_row.nonzero().squeeze(-1)


def row_kv(cache: BatchCache, row: int, columns: torch.Tensor) -> torch.Tensor:
    """The KV of `columns` of batch row `row`: `[layers, 2, H, len(columns), D]`."""
    parts = []
    for layer in cache.layers:
        assert isinstance(layer, GrowingLayer)
        assert layer.keys is not None and layer.values is not None
        parts.append(torch.stack([layer.keys[row, :, columns], layer.values[row, :, columns]]))
    return torch.stack(parts)


def common_blocks(a: Sequence[int], b: Sequence[int], block_tokens: int, limit: int) -> int:
    """How many leading whole blocks (at most `limit`) `a` and `b` have in common."""
    n = min(len(a), len(b)) // block_tokens
    n = min(n, limit)
    i = 0
    while (
        i < n
        and a[i * block_tokens : (i + 1) * block_tokens]
        == (b[i * block_tokens : (i + 1) * block_tokens])
    ):
        i += 1
    return i
