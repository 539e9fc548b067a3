"""The running batch's KV cache: rows join into spare rows, leave by the last rows moving up,
and nobody's KV changes on the way."""

import torch

from agentscope_rft.engines.kv_cache import BatchCache, GrowingLayer

LAYERS, HEADS, DIM = 2, 3, 4


def prompt_kv(length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(LAYERS, 2, HEADS, length, DIM, generator=generator)


def row(cache: BatchCache, index: int, length: int) -> torch.Tensor:
    """The last `length` columns of batch row `index`, all layers: `[layers, 2, H, T, D]`."""
    parts = []
    for layer in cache.layers:
        assert isinstance(layer, GrowingLayer) and layer.keys is not None
        end = layer.get_seq_length()
        keys, values = (
            layer.keys[index, :, end - length : end],
            layer.values[index, :, end - length : end],
        )
        parts.append(torch.stack([keys, values]))
    return torch.stack(parts)


def test_rows_join_into_spare_rows_without_moving_the_running_ones():
    cache = BatchCache(LAYERS)
    first = [prompt_kv(n, seed) for seed, n in enumerate((5, 9, 7))]
    mask = cache.append_rows(first)
    assert mask.tolist()[0] == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    layer = cache.layers[0]
    assert isinstance(layer, GrowingLayer)
    before = layer.buffers()[0].data_ptr()
    joined = cache.append_rows([prompt_kv(6, 10)])  # fits the spare rows and columns
    assert layer.buffers()[0].data_ptr() == before and layer.rows == 4
    assert joined.shape == (1, 6) and cache.get_seq_length() == 9
    for index, (kv, n) in enumerate(zip([*first, prompt_kv(6, 10)], (5, 9, 7, 6), strict=True)):
        assert torch.equal(row(cache, index, n), kv)
    # Everything before a row's tokens, and from the shared end on, reads zeros (masked).
    keys = layer.buffers()[0]
    assert keys[0, :, :4].abs().sum() == 0 and keys[:, :, 9:].abs().sum() == 0
    # A longer newcomer: the running rows stay where they are, zero columns after them.
    cache.append_rows([prompt_kv(12, 11)])
    assert cache.get_seq_length() == 12
    assert torch.equal(row(cache, 1, 12)[:, :, :, :9], prompt_kv(9, 1))
    assert row(cache, 1, 12)[:, :, :, 9:].abs().sum() == 0


def test_leaving_rows_are_filled_by_the_last_ones():
    cache = BatchCache(LAYERS)
    kvs = [prompt_kv(8, seed) for seed in range(6)]
    cache.append_rows(kvs)
    order = cache.remove_rows([1, 4])
    assert order == [0, 5, 2, 3]  # row 5 moved into row 1; row 4's place is past the end
    for index, before in enumerate(order):
        assert torch.equal(row(cache, index, 8), kvs[before])
    assert cache.layers[0].keys.shape[0] == 4
    assert cache.remove_rows([0, 1, 2, 3]) == [] and cache.get_seq_length() == 0
    cache.append_rows([prompt_kv(3, 9)])  # the emptied buffers take new rows again
    assert torch.equal(row(cache, 0, 3), prompt_kv(3, 9))


def test_an_emptied_cache_fits_its_buffers_to_the_next_rows():
    # Decode attention reads every column of the buffers: the room a long prompt left behind
    # must not stay for the short rows after it, but a near fit is reused as it is.
    cache = BatchCache(LAYERS)
    cache.append_rows([prompt_kv(900, 0), prompt_kv(40, 1)])
    cache.remove_rows([0, 1])
    layer = cache.layers[0]
    assert isinstance(layer, GrowingLayer)
    cache.append_rows([prompt_kv(30, 2)])
    keys = layer.buffers()[0]
    assert keys.shape[2] < 200
    assert torch.equal(row(cache, 0, 30), prompt_kv(30, 2))
    before = keys.data_ptr()
    cache.remove_rows([0])
    cache.append_rows([prompt_kv(25, 3)])
    assert layer.buffers()[0].data_ptr() == before  # close enough: no new buffers
    assert torch.equal(row(cache, 0, 25), prompt_kv(25, 3))
