"""Grouped decode attention equals transformers' SDPA attention (GQA, padding mask)."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentscope_rft.engines.attention import decode_attention


@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_attention_matches_sdpa(q_len):
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 3, 6, 2, 11, 8
    query = torch.randn(batch, heads, q_len, dim, generator=generator)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator)
    mask = torch.ones(batch, 1, q_len, length, dtype=torch.bool)
    mask[0, :, :, :4] = False  # left padding
    mask[2, :, :, 5:7] = False  # a hole (cached prefix, then padding, then new tokens)
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads
    module.is_causal = True
    ours, _ = decode_attention(module, query, key, value, mask, scaling=0.3)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert ours.shape == reference.shape == (batch, q_len, heads, dim)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("additive", [False, True])
def test_decode_attention_on_a_view_of_a_growing_buffer(dtype, additive):
    # The cache hands out [:, :, :T] views of zeroed buffers with spare room; attention over the
    # whole buffer (spare columns masked) must equal attention over a dense copy of the view.
    generator = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, length, spare, dim = 3, 6, 2, 9, 7, 8
    buffers = [torch.zeros(batch, kv_heads, length + spare, dim, dtype=dtype) for _ in range(2)]
    for buffer in buffers:
        buffer[:, :, :length] = torch.randn(batch, kv_heads, length, dim, generator=generator)
    key, value = (b[:, :, :length] for b in buffers)
    query = torch.randn(batch, heads, 1, dim, generator=generator).to(dtype)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    mask[1, :, :, :3] = False
    if additive:
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads
    module.is_causal = True
    ours, _ = decode_attention(module, query, key, value, mask, scaling=0.3)
    dense, _ = decode_attention(module, query, key.contiguous(), value.contiguous(), mask, 0.0, 0.3)
    assert ours.shape == (batch, 1, heads, dim)
    tolerance = (
        {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 0}
    )
    torch.testing.assert_close(ours, dense, **tolerance)
