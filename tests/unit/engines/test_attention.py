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
