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

    def merge(self, other: BatchCache) -> None:
        """Append `other`'s rows below ours, left-padding whichever is shorter in time."""
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            assert isinstance(mine, GrowingLayer) and isinstance(theirs, GrowingLayer)
            if mine.get_seq_length() == 0:
                assert theirs.keys is not None and theirs.values is not None
                mine.assign(theirs.keys, theirs.values)
                continue
            assert mine.keys is not None and mine.values is not None
            assert theirs.keys is not None and theirs.values is not None
            length = max(mine.get_seq_length(), theirs.get_seq_length())
            keys = torch.cat([_left_pad(mine.keys, length), _left_pad(theirs.keys, length)])
            values = torch.cat([_left_pad(mine.values, length), _left_pad(theirs.values, length)])
            mine.assign(keys, values)

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


def _left_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - x.shape[2]
    if pad == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], x.shape[1], pad, x.shape[3]), x], dim=2)


def left_pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - mask.shape[1]
    if pad == 0:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], pad), mask], dim=1)
