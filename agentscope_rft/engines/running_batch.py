"""The batch being decoded: one row per sampled choice, its KV cache and decode inputs.

Rows join after their prefill (their KV appended or merged into the running cache, their
attention masks right-aligned beside the running rows'), advance one token per decode step,
and leave when answered: the last running rows move into their places (`compact`), so the rows'
order changes and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from llguidance import LLMatcher

from agentscope_rft.engines.jobs import GenerationJob
from agentscope_rft.engines.kv_cache import BatchCache, left_pad_mask, right_pad_mask

_TRIM_COLUMNS = 64  # leading all-padding columns worth a copy of the cache to drop


@dataclass(eq=False)
class Row:
    """One choice of a job being decoded."""

    job: GenerationJob
    index: int
    generator: torch.Generator | None
    policy_version: int
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None
    stop_string: str | None = None
    matcher: LLMatcher | None = None  # a constrained row's place in its grammar
    retired: bool = False  # answered; `compact` removes its batch row before the answer goes out


class RunningBatch:
    """The running rows and the tensors a decode step reads (engine thread only).

    Example:
        >>> batch = RunningBatch(num_layers=2, max_batch_size=8, device=torch.device("cpu"))
        >>> len(batch.rows), tuple(batch.mask.shape)
        (0, (0, 0))
    """

    def __init__(self, num_layers: int, max_batch_size: int, device: torch.device) -> None:
        self.num_layers = num_layers
        self.max_batch_size = max_batch_size
        self.device = device
        self.rows: list[Row] = []
        self.cache = BatchCache(num_layers, max_batch_size)
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=device)  # [B, T]
        self.next_ids = torch.zeros(0, dtype=torch.long, device=device)  # [B] fed next step
        self.positions = torch.zeros(0, dtype=torch.long, device=device)  # [B] of next_ids

    def add(self, rows: list[Row], mask: torch.Tensor, positions: torch.Tensor) -> list[int]:
        """Add `rows`, whose KV the cache already holds (`mask`: their attention mask, tokens
        right-aligned; `positions`: the position of each row's first token to feed). Returns
        their batch indices."""
        if self.rows:  # the running rows keep their columns (see `BatchCache.merge`)
            length = max(mask.shape[1], self.mask.shape[1])
            self.mask = torch.cat([right_pad_mask(self.mask, length), left_pad_mask(mask, length)])
        else:
            self.mask = mask
        self.positions = torch.cat([self.positions, positions])
        self.next_ids = torch.cat(
            [self.next_ids, torch.zeros(len(rows), dtype=torch.long, device=self.device)]
        )
        start = len(self.rows)
        self.rows.extend(rows)
        return list(range(start, start + len(rows)))

    def merge(self, cache: BatchCache, mask: torch.Tensor, expand: list[int]) -> torch.Tensor:
        """Append rows `expand` of a prefilled `cache` (its `mask`) to the running cache."""
        if len(expand) != mask.shape[0]:
            cache.select_rows(torch.tensor(expand, device=self.device))
        self.cache.merge(cache)
        return mask[torch.tensor(expand, device=self.device)]

    def compact(self) -> None:
        """Drop the retired rows from the batch and its cache (the last running rows move
        into their places; the rows' order changes, nothing else)."""
        holes = [i for i, row in enumerate(self.rows) if row.retired]
        if not holes:
            return
        order = self.cache.remove_rows(holes)
        self.rows = [self.rows[i] for i in order]
        order_t = torch.tensor(order, dtype=torch.long, device=self.device)
        mask = self.mask[order_t]
        self.next_ids = self.next_ids[order_t]
        self.positions = self.positions[order_t]
        # Columns that are padding in every remaining row can go; that copies the cache, so
        # only once they are a quarter of it (masked padding costs attention reads meanwhile).
        used = mask.any(dim=0).nonzero()
        drop_front = int(used[0]) if len(used) else mask.shape[1]
        if order and drop_front >= max(_TRIM_COLUMNS, mask.shape[1] // 4):
            self.cache.drop_front(drop_front)
            mask = mask[:, drop_front:]
        self.mask = mask if order else mask[:, :0]

    def new_cache(self) -> None:
        """Free the cache's buffers for an empty one."""
        self.cache = BatchCache(self.num_layers, self.max_batch_size)

    def clear(self) -> None:
        """Drop every row and the cache's buffers."""
        self.rows = []
        self.new_cache()
        self.mask = self.mask[:0, :0]
        self.next_ids = self.next_ids[:0]
        self.positions = self.positions[:0]
