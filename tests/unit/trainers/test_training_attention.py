"""The trainer's CPU attention (grouped K/V heads, no copies) equals transformers' `sdpa` on a
padded batch: outputs and gradients."""

from __future__ import annotations

import torch

from agentscope_rft.models import load_causal_lm
from agentscope_rft.trainers.attention import NAME, use_training_attention


def _loss_and_grads(model, ids, mask):  # type: ignore[no-untyped-def]
    model.zero_grad(set_to_none=True)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    loss = (hidden * mask.unsqueeze(-1)).square().mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return hidden[mask.bool()], grads


def test_grouped_attention_equals_sdpa_on_a_padded_batch(tiny_model_path: str) -> None:
    model = load_causal_lm(tiny_model_path).train()
    text = model.config.get_text_config()
    assert text.num_key_value_heads < text.num_attention_heads  # grouped heads: the case at hand
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (3, 24), generator=gen)
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, 17:] = 0
    mask[2, 9:] = 0
    want_hidden, want_grads = _loss_and_grads(model, ids, mask)
    assert use_training_attention(model, torch.device("cpu"))
    assert model.config._attn_implementation == NAME
    got_hidden, got_grads = _loss_and_grads(model, ids, mask)
    torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-5, atol=1e-6)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def test_cuda_keeps_sdpa(tiny_model_path: str) -> None:
    model = load_causal_lm(tiny_model_path)
    assert not use_training_attention(model, torch.device("cuda"))
    assert model.config._attn_implementation == "sdpa"
