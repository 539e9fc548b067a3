"""oneDNN-packed linear weights: the same outputs as F.linear, retaken after a weight swap."""

import pytest
import torch

from agentscope_rft.engines.packed import pack_linear_weights, packing_unsupported
from agentscope_rft.engines.weights import copy_weights
from agentscope_rft.models import load_causal_lm

pytestmark = pytest.mark.skipif(
    packing_unsupported(torch.nn.Linear(4, 4, dtype=torch.bfloat16)) is not None,
    reason="no oneDNN bf16 packing on this machine",
)


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def test_packed_model_gives_the_same_logits_and_follows_weight_swaps(tiny_model_path):
    plain = load_causal_lm(tiny_model_path, dtype=torch.bfloat16)
    packed = load_causal_lm(tiny_model_path, dtype=torch.bfloat16)
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed.modules())
    assert pack_linear_weights(packed) == linears > 0
    assert set(packed.state_dict()) == set(plain.state_dict())  # names unchanged
    ids = [[5, 17, 99, 3, 42, 8], [1, 2, 3, 4, 5, 6]]
    assert torch.equal(logits(packed, ids), logits(plain, ids))

    # New weights copied in place: the packed copies are retaken, never the old ones served.
    generator = torch.Generator().manual_seed(0)
    new = {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
        for name, tensor in plain.state_dict().items()
    }
    copy_weights(plain, new)
    before = logits(packed, ids)
    copy_weights(packed, new)
    after = logits(packed, ids)
    assert not torch.equal(before, after)
    assert torch.equal(after, logits(plain, ids))


def test_fp32_and_trainable_layers_keep_f_linear(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    assert "bf16/fp16" in (packing_unsupported(model) or "")
    layer = torch.nn.Linear(8, 4, dtype=torch.bfloat16)
    pack_linear_weights(layer)
    x = torch.randn(2, 8, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()  # with grad enabled the plain path runs: gradients flow
    assert layer.weight.grad is not None and x.grad is not None
