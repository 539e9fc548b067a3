"""The block-level prefix cache: exact-prefix lookup, LRU eviction under a budget, versions."""

import pytest
import torch

from agentscope_rft.engines.prefill import build_prefill, common_blocks, token_columns
from agentscope_rft.engines.prefix_cache import PrefixCache

LAYERS, HEADS, DIM = 2, 1, 4
BLOCK_BYTES = LAYERS * 2 * HEADS * 2 * DIM * 4  # 2-token blocks, fp32


def positional_kv(start: int, end: int) -> torch.Tensor:
    """KV whose every entry is its position, so a block's content says where it came from."""
    pos = torch.arange(start, end, dtype=torch.float32)
    return pos.view(1, 1, 1, -1, 1).expand(LAYERS, 2, HEADS, end - start, DIM).clone()


class Reader:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, start: int, end: int) -> torch.Tensor:
        self.calls.append((start, end))
        return positional_kv(start, end)


def test_match_finds_longest_cached_prefix_and_leaves_one_token():
    cache = PrefixCache(block_tokens=2, budget_bytes=1 << 20)
    reader = Reader()
    assert cache.insert([1, 2, 3, 4, 5, 6, 7], reader, version=0) == 3  # the 7th is no block
    assert reader.calls == [(0, 6)]
    chain = cache.match([1, 2, 3, 4, 9, 9], version=0)
    assert [b.tokens for b in chain] == [(1, 2), (3, 4)]
    assert torch.cat([b.kv for b in chain], dim=3)[0, 0, 0, :, 0].tolist() == [0, 1, 2, 3]
    # A prompt equal to the cached tokens keeps its last token out of the match.
    assert len(cache.match([1, 2, 3, 4, 5, 6], version=0)) == 2
    assert cache.match([2, 1, 3, 4], version=0) == []  # same tokens, other prefix: no hit
    assert cache.metrics()["prefix_cache/hit_tokens"] == 8


def test_insert_reads_only_the_uncached_tail():
    cache = PrefixCache(block_tokens=2, budget_bytes=1 << 20)
    cache.insert([1, 2, 3, 4], Reader(), version=0)
    reader = Reader()
    assert cache.insert([1, 2, 3, 4, 5, 6, 7, 8], reader, version=0) == 2
    assert reader.calls == [(4, 8)]
    assert cache.insert([1, 2, 3, 4, 5, 6], reader, version=0) == 0
    assert reader.calls == [(4, 8)]
    assert len(cache) == 4


def test_lru_evicts_leaves_first_within_budget():
    cache = PrefixCache(block_tokens=2, budget_bytes=5 * BLOCK_BYTES)
    shared = [1, 2, 3, 4]
    cache.insert([*shared, 10, 11, 12, 13], Reader(), version=0)  # blocks: s1 s2 a1 a2
    cache.insert([*shared, 20, 21], Reader(), version=0)  # + b1 = 5 blocks, full
    cache.match([*shared, 10, 11, 12, 13, 0], version=0)  # a-chain is now the most recent
    cache.insert([*shared, 30, 31], Reader(), version=0)  # + c1: one block must go
    assert cache.bytes <= cache.budget_bytes
    assert cache.metrics()["prefix_cache/evicted_blocks"] == 1
    assert len(cache.match([*shared, 20, 21, 0], version=0)) == 2  # b1 (LRU leaf) went
    assert len(cache.match([*shared, 10, 11, 12, 13, 0], version=0)) == 4
    assert len(cache.match([*shared, 30, 31, 0], version=0)) == 3
    # Shrink hard: everything goes, deepest first; what stays is always a whole prefix.
    cache.budget_bytes = 2 * BLOCK_BYTES
    cache.insert([7, 7, 7, 7], Reader(), version=0)
    assert len(cache) == 2 and cache.bytes == 2 * BLOCK_BYTES
    assert len(cache.match([7, 7, 7, 7, 0], version=0)) == 2
    assert cache.match([*shared, 0], version=0) == []


def test_a_block_larger_than_the_budget_is_not_kept():
    cache = PrefixCache(block_tokens=2, budget_bytes=BLOCK_BYTES - 1)
    cache.insert([1, 2, 3, 4], Reader(), version=0)
    assert len(cache) == 0 and cache.bytes == 0
    assert cache.match([1, 2, 3, 4, 5], version=0) == []


def test_zero_budget_reads_nothing():
    cache = PrefixCache(block_tokens=2, budget_bytes=0)
    reader = Reader()
    assert cache.insert([1, 2, 3, 4], reader, version=0) == 0
    assert reader.calls == []


def test_clear_and_versions_never_serve_old_kv():
    cache = PrefixCache(block_tokens=2, budget_bytes=1 << 20)
    cache.insert([1, 2, 3, 4, 5], Reader(), version=0)
    assert cache.match([1, 2, 3, 4, 5], version=1) == []  # computed by another policy
    cache.insert([1, 2, 3, 4, 5], lambda s, e: positional_kv(s, e) + 100, version=1)
    [first, second] = cache.match([1, 2, 3, 4, 5], version=1)
    assert first.version == second.version == 1 and float(first.kv.min()) >= 100
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0
    assert cache.match([1, 2, 3, 4, 5], version=1) == []
    assert cache.metrics()["prefix_cache/clears"] == 1


def test_metrics_report_hit_rate():
    cache = PrefixCache(block_tokens=2, budget_bytes=1 << 20)
    cache.match([1, 2, 3, 4, 5], version=0)
    cache.insert([1, 2, 3, 4, 5], Reader(), version=0)
    cache.match([1, 2, 3, 4, 5], version=0)
    metrics = cache.metrics()
    assert metrics["prefix_cache/hit_rate"] == pytest.approx(4 / 10)
    assert metrics["prefix_cache/cached_tokens"] == 4
    assert metrics["prefix_cache/cached_gib"] == pytest.approx(2 * BLOCK_BYTES / 2**30)


def test_bad_block_size_is_an_error():
    with pytest.raises(ValueError, match="block_tokens must be >= 1"):
        PrefixCache(block_tokens=0)


def test_prefill_layout_places_past_and_new_tokens():
    past = positional_kv(0, 3)  # row 0 has 3 cached tokens, row 1 none
    batch = build_prefill([[7, 8], [5, 6, 9, 9]], [past, None], LAYERS, pad_id=0, device="cpu")
    assert batch.past_len == 3
    assert batch.input_ids.tolist() == [[0, 0, 7, 8], [5, 6, 9, 9]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 0, 3, 4], [0, 1, 2, 3]]
    keys = batch.cache.layers[1].keys
    assert keys is not None and keys[0, 0, :, 0].tolist() == [0, 1, 2]
    assert keys[1].abs().sum() == 0
    assert token_columns(batch.attention_mask[0]).tolist() == [0, 1, 2, 5, 6]


def test_common_blocks():
    assert common_blocks([1, 2, 3, 4, 5], [1, 2, 3, 9], 2, limit=10) == 1
    assert common_blocks([1, 2, 3, 4], [1, 2, 3, 4], 2, limit=1) == 1
    assert common_blocks([1, 2], [3, 4], 2, limit=5) == 0
