"""Block-level prefix cache: the KV of token blocks computed by earlier requests, reused by later.

A prompt is cut into blocks of `block_tokens` tokens. A block is keyed by (the id of the block
before it, its tokens), so a key names the whole prefix up to it exactly (no hash collisions: the
dict compares the token tuples). A new request walks the chain from the start and attaches to the
longest run of cached blocks; only the rest of its prompt is prefilled. Blocks hold the KV of all
decoder layers (`[layers, 2, kv_heads, block_tokens, head_dim]`, keys and values).

Eviction is LRU under a byte budget. Every lookup and insert touches its chain from the deepest
block up to the first, so a block is always more recently used than its descendants and the least
recently used block is a leaf: evicting it never strands a cached descendant.

The cache belongs to one policy version: the engine calls `clear()` when it swaps weights, and
every block records the version that computed it (`match` ignores blocks of another version).

Example:
    >>> import torch
    >>> cache = PrefixCache(block_tokens=2, budget_bytes=1 << 20)
    >>> kv = torch.zeros(1, 2, 1, 4, 8)  # 1 layer, K and V, 1 head, 4 tokens, dim 8
    >>> cache.insert([5, 6, 7, 8, 9], lambda start, end: kv[:, :, :, start:end], version=0)
    2
    >>> len(cache.match([5, 6, 7, 1, 2], version=0))
    1
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

KVSlice = Callable[[int, int], torch.Tensor]
"""(start, end) -> the KV of positions [start, end): `[layers, 2, kv_heads, end - start, dim]`."""

_ROOT = 0


@dataclass(eq=False, slots=True)
class CachedBlock:
    block_id: int
    parent_id: int
    tokens: tuple[int, ...]
    kv: torch.Tensor
    """`[layers, 2, kv_heads, block_tokens, head_dim]` (its own storage)."""
    version: int
    children: int = 0

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class PrefixCache:
    """Cached KV blocks keyed by exact token prefixes, LRU-evicted under `budget_bytes`."""

    def __init__(self, block_tokens: int = 16, budget_bytes: int = 1 << 30) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self.budget_bytes = budget_bytes
        self._index: dict[tuple[int, tuple[int, ...]], CachedBlock] = {}
        self._lru: collections.OrderedDict[int, CachedBlock] = collections.OrderedDict()
        self._next_id = _ROOT + 1
        self.bytes = 0
        self.stats = collections.Counter[str]()

    def __len__(self) -> int:
        return len(self._lru)

    def _key(self, parent_id: int, token_ids: Sequence[int], i: int) -> tuple[int, tuple[int, ...]]:
        size = self.block_tokens
        return parent_id, tuple(token_ids[i * size : (i + 1) * size])

    def _walk(self, token_ids: Sequence[int], max_blocks: int, version: int) -> list[CachedBlock]:
        chain: list[CachedBlock] = []
        parent = _ROOT
        for i in range(max_blocks):
            block = self._index.get(self._key(parent, token_ids, i))
            if block is None or block.version != version:
                break
            chain.append(block)
            parent = block.block_id
        return chain

    def _touch(self, chain: list[CachedBlock]) -> None:
        for block in reversed(chain):  # deepest first: ancestors end up more recent
            self._lru.move_to_end(block.block_id)

    def peek(self, token_ids: Sequence[int], version: int) -> int:
        """Tokens of `token_ids` a `match` would find cached now (no stats, no LRU touch)."""
        limit = (len(token_ids) - 1) // self.block_tokens
        return len(self._walk(token_ids, limit, version)) * self.block_tokens

    def match(self, token_ids: Sequence[int], version: int) -> list[CachedBlock]:
        """The longest chain of cached blocks that starts `token_ids`.

        At least one token is always left out (its logits must be computed), so a prompt of
        `n` tokens matches at most `(n - 1) // block_tokens` blocks.
        """
        limit = (len(token_ids) - 1) // self.block_tokens
        chain = self._walk(token_ids, limit, version)
        self._touch(chain)
        self.stats["lookups"] += 1
        self.stats["lookup_tokens"] += len(token_ids)
        self.stats["hit_tokens"] += len(chain) * self.block_tokens
        return chain

    def insert(self, token_ids: Sequence[int], kv_slice: KVSlice, version: int) -> int:
        """Cache the full blocks of `token_ids` that are not cached yet; return how many.

        `kv_slice(start, end)` gives the KV of those positions; it is called once, for the
        uncached tail only.
        """
        full = len(token_ids) // self.block_tokens
        chain = self._walk(token_ids, full, version)
        have = len(chain)
        if have == full or self.budget_bytes <= 0:
            self._touch(chain)
            return 0
        size = self.block_tokens
        kv = kv_slice(have * size, full * size)
        parent = chain[-1] if chain else None
        added = 0
        for i, part in enumerate(kv.split(size, dim=3)):
            key = self._key(parent.block_id if parent else _ROOT, token_ids, have + i)
            stale = self._index.get(key)
            if stale is not None:  # a block of another version: replace it
                self._evict(stale)
            block = CachedBlock(
                block_id=self._next_id,
                parent_id=key[0],
                tokens=key[1],
                kv=part.clone(),
                version=version,
            )
            self._next_id += 1
            self._index[key] = block
            self._lru[block.block_id] = block
            if parent is not None:
                parent.children += 1
            self.bytes += block.nbytes
            chain.append(block)
            parent = block
            added += 1
        self.stats["inserted_blocks"] += added
        self._touch(chain)
        self._evict_to_budget()
        return added

    def _evict(self, block: CachedBlock) -> None:
        del self._index[(block.parent_id, block.tokens)]
        del self._lru[block.block_id]
        self.bytes -= block.nbytes
        parent = self._lru.get(block.parent_id)
        if parent is not None:
            parent.children -= 1

    def _evict_to_budget(self) -> None:
        while self.bytes > self.budget_bytes and self._lru:
            victim = next(iter(self._lru.values()))
            if victim.children:  # cannot happen while the LRU order invariant holds
                raise RuntimeError("prefix cache LRU order is broken: a parent aged past a child")
            self._evict(victim)
            self.stats["evicted_blocks"] += 1

    def clear(self) -> None:
        """Drop every block (called on a weight swap: old KV must never be reused)."""
        self._index.clear()
        self._lru.clear()
        self.bytes = 0
        self.stats["clears"] += 1

    def metrics(self) -> dict[str, float]:
        """Hit rate (cached / looked-up prompt tokens), cached tokens, evictions, size."""
        looked = self.stats["lookup_tokens"]
        return {
            "prefix_cache/hit_rate": self.stats["hit_tokens"] / looked if looked else 0.0,
            "prefix_cache/hit_tokens": float(self.stats["hit_tokens"]),
            "prefix_cache/lookup_tokens": float(looked),
            "prefix_cache/cached_tokens": float(len(self._lru) * self.block_tokens),
            "prefix_cache/cached_gib": self.bytes / 2**30,
            "prefix_cache/evicted_blocks": float(self.stats["evicted_blocks"]),
            "prefix_cache/clears": float(self.stats["clears"]),
        }
