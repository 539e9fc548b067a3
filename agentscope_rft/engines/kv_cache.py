"""A KV cache for a batch of left-padded sequences that join and leave between decode steps.

HF's `DynamicLayer` concatenates on every step (copying the whole cache); `GrowingLayer` writes
into a preallocated buffer instead. `BatchCache` adds what continuous batching needs: merging a
freshly prefilled batch into the running one (left-padding the shorter), dropping finished rows,
and trimming columns that are padding in every row.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

_GROW_TOKENS = 64


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer backed by a buffer with spare room along the time axis."""

    def __init__(self) -> None:
        super().__init__()
        self._buf_k: torch.Tensor | None = None
        self._buf_v: torch.Tensor | None = None
        self._length = 0

    def assign(self, keys: torch.Tensor, values: torch.Tensor, spare: int = _GROW_TOKENS) -> None:
        """Replace the content with `keys`/`values` ([B, H, T, D])."""
        batch, heads, length, dim = keys.shape
        # Zeroed: decode attention reads the spare columns (masked; see attention.py).
        self._buf_k = keys.new_zeros(batch, heads, length + spare, dim)
        self._buf_v = values.new_zeros(batch, heads, length + spare, dim)
        self._buf_k[:, :, :length].copy_(keys)
        self._buf_v[:, :, :length].copy_(values)
        self._length = length
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._refresh_views()

    def adopt(self, buf_k: torch.Tensor, buf_v: torch.Tensor, length: int) -> None:
        """Take `buf_k`/`buf_v` ([B, H, capacity, D], zeros from `length` on) as the buffers,
        without copying."""
        self._buf_k, self._buf_v, self._length = buf_k, buf_v, length
        self.dtype, self.device = buf_k.dtype, buf_k.device
        self.is_initialized = True
        self._refresh_views()

    def _refresh_views(self) -> None:
        assert self._buf_k is not None and self._buf_v is not None
        self.keys = self._buf_k[:, :, : self._length]
        self.values = self._buf_v[:, :, : self._length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._buf_k is None:
            self.assign(key_states, value_states)
            assert self.keys is not None and self.values is not None
            return self.keys, self.values
        assert self._buf_v is not None
        new = key_states.shape[-2]
        self.reserve(new)
        assert self._buf_k is not None and self._buf_v is not None
        self._buf_k[:, :, self._length : self._length + new].copy_(key_states)
        self._buf_v[:, :, self._length : self._length + new].copy_(value_states)
        self._length += new
        self._refresh_views()
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        """Time steps the buffers hold before they must grow."""
        return 0 if self._buf_k is None else self._buf_k.shape[2]

    def reserve(self, new: int) -> None:
        """Grow the buffers now if `new` more time steps would not fit (by a quarter at least:
        a long prompt prefilled in chunks copies O(n) in total)."""
        if self._buf_k is not None and self._length + new > self._buf_k.shape[2]:
            assert self.keys is not None and self.values is not None
            self.assign(self.keys, self.values, spare=max(new + _GROW_TOKENS, self._length // 4))

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key/value buffers [B, H, capacity, D]: columns from `get_seq_length()` on
        are zeros (never written)."""
        assert self._buf_k is not None and self._buf_v is not None
        return self._buf_k, self._buf_v

    def append(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Add one row per `keys[j]`/`values[j]` (`[H, T_j, D]`) below ours, all ending at the
        longest length of the two (see `BatchCache.merge`), in one copy of everything."""
        theirs = max(k.shape[1] for k in keys)
        heads, dim = keys[0].shape[0], keys[0].shape[2]
        rows = capacity = 0
        if self._buf_k is not None and self._length > 0:
            rows, heads, capacity, dim = self._buf_k.shape
        length = max(self._length if rows else 0, theirs)
        capacity = max(capacity, length + _GROW_TOKENS)
        buffers = []
        for mine, new in ((self._buf_k, keys), (self._buf_v, values)):
            merged = new[0].new_empty(rows + len(new), heads, capacity, dim)
            if rows:  # ours as they are (columns from our length on are zeros), then zeros
                assert mine is not None
                merged[:rows, :, : mine.shape[2]] = mine
                merged[:rows, :, mine.shape[2] :] = 0
            for j, row in enumerate(new):  # theirs right-aligned at `length`, zeros around
                start = length - row.shape[1]
                merged[rows + j, :, :start] = 0
                merged[rows + j, :, start:length] = row
                merged[rows + j, :, length:] = 0
            buffers.append(merged)
        self.adopt(buffers[0], buffers[1], length)

    def select_rows(self, rows: torch.Tensor, drop_front: int) -> None:
        assert self.keys is not None and self.values is not None
        self.assign(self.keys[rows, :, drop_front:], self.values[rows, :, drop_front:])


class BatchCache(DynamicCache):
    """The running batch's cache: one `GrowingLayer` per decoder layer.

    Example:
        >>> cache = BatchCache(num_layers=2)
        >>> cache.get_seq_length()
        0
    """

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.layers = [GrowingLayer() for _ in range(num_layers)]

    def append_rows(self, kvs: list[torch.Tensor]) -> torch.Tensor:
        """Append one row per `kvs[j]` (`[layers, 2, H, T_j, D]`, e.g. a prefilled prompt's KV),
        each copied once, ending where ours end (see `merge`). Returns the new rows' attention
        mask `[rows, longest T_j]` (1 on each row's tokens, right-aligned)."""
        lengths = [kv.shape[3] for kv in kvs]
        width = max(lengths)
        mask = torch.zeros(len(kvs), width, dtype=torch.long, device=kvs[0].device)
        for j, length in enumerate(lengths):
            mask[j, width - length :] = 1
        for index, layer in enumerate(self.layers):
            assert isinstance(layer, GrowingLayer)
            layer.append([kv[index, 0] for kv in kvs], [kv[index, 1] for kv in kvs])
        return mask

    def merge(self, other: BatchCache) -> None:
        """Append `other`'s rows below ours, in one copy of each.

        Both end at the same column (where the next token's KV goes): `other`'s rows are
        left-padded when shorter; when they are longer, ours stay where they are and the columns
        between their end and the new end stay zero (masked out by the caller's attention mask),
        so the running rows are copied once, not shifted.
        """
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            assert isinstance(mine, GrowingLayer) and isinstance(theirs, GrowingLayer)
            if mine.get_seq_length() == 0:
                mine.adopt(*theirs.buffers(), theirs.get_seq_length())
                continue
            assert theirs.keys is not None and theirs.values is not None
            mine.append(list(theirs.keys), list(theirs.values))

    def reserve(self, new: int) -> None:
        """Grow every layer's buffers now if `new` more time steps would not fit."""
        for layer in self.layers:
            assert isinstance(layer, GrowingLayer)
            layer.reserve(new)

    def select_rows(self, rows: torch.Tensor, drop_front: int = 0) -> None:
        """Keep only `rows` (batch indices) and drop the first `drop_front` time steps."""
        for layer in self.layers:
            assert isinstance(layer, GrowingLayer)
            layer.select_rows(rows, drop_front)


def right_pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - mask.shape[1]
    if pad == 0:
        return mask
    return torch.cat([mask, mask.new_zeros(mask.shape[0], pad)], dim=1)


def left_pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - mask.shape[1]
    if pad == 0:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], pad), mask], dim=1)
