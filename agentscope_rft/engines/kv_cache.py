"""A KV cache for a batch of left-padded sequences that join and leave between decode steps.

HF's `DynamicLayer` concatenates on every step (copying the whole cache); `GrowingLayer` writes
into preallocated buffers instead, with spare columns and spare rows. `BatchCache` adds what
continuous batching needs: rows joining the running batch (into spare rows, all rows ending at
the same column), dropping finished rows (the rows behind them move up), and trimming columns
that are padding in every row.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

_GROW_TOKENS = 64


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer backed by buffers with spare room along time and batch.

    The buffers are `[row capacity, H, time capacity, D]`; the first `rows` rows are the
    batch's, and every column from `get_seq_length()` on is zero in them (decode attention reads
    the whole time capacity, masked). Rows join into spare rows and leave by the rows behind
    them moving up, so the running rows are not copied when others join or leave; the buffers
    are reallocated only to grow.
    """

    def __init__(self, max_rows: int | None = None) -> None:
        super().__init__()
        self._buf_k: torch.Tensor | None = None
        self._buf_v: torch.Tensor | None = None
        self._length = 0
        self._rows = 0
        self.max_rows = max_rows  # the most rows the batch will have (spare rows stop there)

    def _row_capacity(self, needed: int) -> int:
        """Rows to allocate for `needed`: room for more joiners (they come in waves)."""
        spare = max(needed // 2, 4)
        if self.max_rows is not None and needed <= self.max_rows:
            return min(needed + spare, self.max_rows)
        return needed + spare

    def assign(self, keys: torch.Tensor, values: torch.Tensor, spare: int = _GROW_TOKENS) -> None:
        """Replace the content with `keys`/`values` ([B, H, T, D])."""
        batch, heads, length, dim = keys.shape
        # Zeroed: decode attention reads the spare columns (masked; see attention.py).
        self._buf_k = keys.new_zeros(batch, heads, length + spare, dim)
        self._buf_v = values.new_zeros(batch, heads, length + spare, dim)
        self._buf_k[:, :, :length].copy_(keys)
        self._buf_v[:, :, :length].copy_(values)
        self._length, self._rows = length, batch
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._refresh_views()

    def adopt(self, buf_k: torch.Tensor, buf_v: torch.Tensor, length: int) -> None:
        """Take `buf_k`/`buf_v` ([B, H, capacity, D], zeros from `length` on) as the buffers,
        without copying."""
        self._buf_k, self._buf_v, self._length = buf_k, buf_v, length
        self._rows = buf_k.shape[0]
        self.dtype, self.device = buf_k.dtype, buf_k.device
        self.is_initialized = True
        self._refresh_views()

    def _refresh_views(self) -> None:
        assert self._buf_k is not None and self._buf_v is not None
        self.keys = self._buf_k[: self._rows, :, : self._length]
        self.values = self._buf_v[: self._rows, :, : self._length]

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
        rows, end = self._rows, self._length + new
        self._buf_k[:rows, :, self._length : end].copy_(key_states)
        self._buf_v[:rows, :, self._length : end].copy_(value_states)
        self._length = end
        self._refresh_views()
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    @property
    def rows(self) -> int:
        """Rows of the batch."""
        return self._rows

    @property
    def capacity(self) -> int:
        """Time steps the buffers hold before they must grow."""
        return 0 if self._buf_k is None else self._buf_k.shape[2]

    def _regrow(self, rows: int, capacity: int) -> None:
        """New buffers of `rows` x `capacity` holding our rows (zeros elsewhere)."""
        assert self._buf_k is not None and self._buf_v is not None
        _, heads, _, dim = self._buf_k.shape
        used = min(self._buf_k.shape[2], capacity)
        grown = []
        for old in (self._buf_k, self._buf_v):
            new = old.new_zeros(rows, heads, capacity, dim)
            new[: self._rows, :, :used] = old[: self._rows, :, :used]
            grown.append(new)
        self._buf_k, self._buf_v = grown
        self._refresh_views()

    def reserve(self, new: int) -> None:
        """Grow the buffers now if `new` more time steps would not fit."""
        if self._buf_k is not None and self._length + new > self._buf_k.shape[2]:
            # Decode attention reads every column of the buffers, spare ones included, so one
            # token at a time grows by a little; a long prompt in chunks by a quarter.
            spare = new + _GROW_TOKENS if new == 1 else max(new + _GROW_TOKENS, self._length // 4)
            self._regrow(self._buf_k.shape[0], self._length + spare)

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch rows' whole key/value buffers [B, H, capacity, D]: columns from
        `get_seq_length()` on are zeros (never written)."""
        assert self._buf_k is not None and self._buf_v is not None
        return self._buf_k[: self._rows], self._buf_v[: self._rows]

    def append(
        self, keys: list[torch.Tensor], values: list[torch.Tensor], expect_rows: int = 0
    ) -> None:
        """Add one row per `keys[j]`/`values[j]` (`[H, T_j, D]`) after ours, all ending at the
        longest length of the two (see `BatchCache.merge`). Ours are not copied unless the
        buffers must grow; when they do, they get room for `expect_rows` rows (more rows the
        caller knows are coming) and spare columns."""
        theirs = max(k.shape[1] for k in keys)
        if self._buf_k is None or self._rows == 0:
            # An empty cache keeps its buffers only while their time capacity is about what
            # the newcomers need: decode attention reads every column, so the spare columns
            # left by an earlier long prompt would cost every later step.
            heads, dim = keys[0].shape[0], keys[0].shape[2]
            capacity = theirs + _GROW_TOKENS
            old = self._buf_k
            if old is not None and theirs < old.shape[2] <= capacity + _GROW_TOKENS:
                capacity = old.shape[2]
            needed = max(len(keys), expect_rows)
            if old is None or old.shape[0] < needed or old.shape[2] != capacity:
                rows_capacity = self._row_capacity(needed)
                if old is not None:
                    rows_capacity = max(rows_capacity, old.shape[0])
                self._buf_k = keys[0].new_empty(rows_capacity, heads, capacity, dim)
                self._buf_v = values[0].new_empty(rows_capacity, heads, capacity, dim)
            self._length, self._rows = 0, 0
        assert self._buf_k is not None and self._buf_v is not None
        rows = self._rows
        length = max(self._length, theirs)
        needed_rows = rows + len(keys)
        if needed_rows > self._buf_k.shape[0] or length >= self._buf_k.shape[2]:
            self._regrow(
                max(self._buf_k.shape[0], self._row_capacity(max(needed_rows, expect_rows))),
                max(self._buf_k.shape[2], length + _GROW_TOKENS),
            )
        # Ours: columns from our length on are zeros already, so they end at `length` as they
        # are. Theirs: right-aligned at `length`, zeros around (the rows may hold old data).
        for buffer, new in ((self._buf_k, keys), (self._buf_v, values)):
            for j, row in enumerate(new):
                start = length - row.shape[1]
                buffer[rows + j, :, :start] = 0
                buffer[rows + j, :, start:length] = row
                buffer[rows + j, :, length:] = 0
        self._rows, self._length = needed_rows, length
        self._refresh_views()

    def select_rows(self, rows: torch.Tensor, drop_front: int) -> None:
        """Keep `rows` (batch indices, any order, repeats allowed) and drop the first
        `drop_front` columns: a copy into new buffers."""
        assert self.keys is not None and self.values is not None
        self.assign(self.keys[rows, :, drop_front:], self.values[rows, :, drop_front:])

    def move_rows(self, moves: list[tuple[int, int]], rows: int) -> None:
        """Copy row `source` to row `target` for each `(source, target)`, in order, then keep
        the first `rows` rows (in place: the other rows' data is not touched)."""
        assert self._buf_k is not None and self._buf_v is not None
        for source, target in moves:
            self._buf_k[target] = self._buf_k[source]
            self._buf_v[target] = self._buf_v[source]
        self._rows = rows
        if not rows:
            self._length = 0
        self._refresh_views()


class BatchCache(DynamicCache):
    """The running batch's cache: one `GrowingLayer` per decoder layer.

    Example:
        >>> cache = BatchCache(num_layers=2)
        >>> cache.get_seq_length()
        0
    """

    def __init__(self, num_layers: int, max_rows: int | None = None) -> None:
        super().__init__()
        self.layers = [GrowingLayer(max_rows) for _ in range(num_layers)]

    def append_rows(self, kvs: list[torch.Tensor], expect_rows: int = 0) -> torch.Tensor:
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
            layer.append([kv[index, 0] for kv in kvs], [kv[index, 1] for kv in kvs], expect_rows)
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

    def remove_rows(self, holes: list[int]) -> list[int]:
        """Drop rows `holes` (batch indices): the last remaining rows move into their places, so
        only as many rows are copied as leave. Returns, for each row now, its index before."""
        first = self.layers[0]
        assert isinstance(first, GrowingLayer)
        rows = first.rows
        gone = set(holes)
        remaining = rows - len(gone)
        movers = [i for i in range(remaining, rows) if i not in gone]
        targets = sorted(h for h in gone if h < remaining)
        moves = list(zip(movers, targets, strict=True))
        order = list(range(remaining))
        for source, target in moves:
            order[target] = source
        for layer in self.layers:
            assert isinstance(layer, GrowingLayer)
            layer.move_rows(moves, remaining)
        return order

    def drop_front(self, columns: int) -> None:
        """Drop the first `columns` time steps of every row (padding in all of them): a copy."""
        for layer in self.layers:
            assert isinstance(layer, GrowingLayer) and layer.keys is not None
            rows = torch.arange(layer.keys.shape[0], device=layer.keys.device)
            layer.select_rows(rows, columns)

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
