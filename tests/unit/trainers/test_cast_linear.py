"""Linear layers under bf16 autocast keep their fp32 weights for backward, not bf16 casts."""

from __future__ import annotations

import copy

import torch
from torch import nn

from agentscope_rft.trainers.cast_linear import recast_linear_layers


def _model(seed: int, bias: bool) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(24, 40, bias=bias),
        nn.SiLU(),
        nn.Linear(40, 24, bias=bias),
        nn.SiLU(),
        nn.Linear(24, 8, bias=bias),
    )


def _grads(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x * 1.0)  # a non-leaf, as hidden states are (autocast caches a leaf's cast)
    (out.float() ** 2).sum().backward()
    assert x.grad is not None
    return x.grad, [p.grad for p in model.parameters()]


def test_gradients_bit_identical_to_autocast() -> None:
    # the same bf16 matmuls of the same operands: equal bit for bit, in fp32 like autocast's
    for bias in (False, True):
        plain = _model(0, bias)
        recast = copy.deepcopy(plain)
        assert recast_linear_layers(recast) == 3
        x = torch.randn(2, 7, 24)
        want_x, want = _grads(plain, x)
        got_x, got = _grads(recast, x)
        assert torch.equal(got_x, want_x)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == torch.float32
            assert torch.equal(g, w)


def test_no_bf16_copy_of_a_weight_is_kept_for_backward() -> None:
    def kept_weight_casts(model: nn.Module) -> int:
        shapes = {tuple(sorted(p.shape)) for p in model.parameters() if p.dim() == 2}
        kept: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            kept.append(t)
            return t

        x = torch.randn(3, 24, requires_grad=True)
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with hooks, torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).float().sum().backward()
        return sum(t.dtype == torch.bfloat16 and tuple(sorted(t.shape)) in shapes for t in kept)

    plain = _model(1, True)
    recast = copy.deepcopy(plain)
    recast_linear_layers(recast)
    assert kept_weight_casts(plain) == 3  # autocast keeps each layer's bf16 weight
    assert kept_weight_casts(recast) == 0


def test_outside_autocast_and_frozen_weights_run_as_before() -> None:
    plain = _model(2, True)
    recast = copy.deepcopy(plain)
    recast_linear_layers(recast)
    x = torch.randn(4, 24)
    torch.testing.assert_close(recast(x), plain(x), rtol=0, atol=0)  # fp32: the plain path
    recast.requires_grad_(False)
    x.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        recast(x).float().sum().backward()
    assert x.grad is not None and all(p.grad is None for p in recast.parameters())


class _Attention(nn.Module):
    """Three projections reading one input, as a decoder layer's q/k/v (and gate/up) do."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.q, self.k, self.v = (nn.Linear(24, 16, bias=False) for _ in range(3))
        self.out = nn.Linear(16, 24, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = (self.q(x) * self.k(x)).softmax(-1)
        return self.out(scores * self.v(x))


def _saved_input_casts(model: nn.Module, x: torch.Tensor) -> int:
    """Distinct bf16 copies of `x` (by storage; any view of one) saved for backward; `x` made a
    non-leaf, as a layer's normed hidden states are (autocast caches the cast of a leaf)."""
    x = x.clone().requires_grad_() * 1.0
    kept: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bfloat16 and t.numel() == x.numel():
            kept[t.untyped_storage().data_ptr()] = t
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).float().sum().backward()
    return len(kept)


def test_layers_reading_one_input_share_its_cast() -> None:
    plain = _Attention()
    recast = copy.deepcopy(plain)
    assert recast_linear_layers(recast) == 4
    x = torch.randn(2, 5, 24)
    assert _saved_input_casts(plain, x) == 3  # autocast keeps one cast per projection
    assert _saved_input_casts(recast, x) == 1
    want_x, want = _grads(plain, x)
    got_x, got = _grads(recast, x)
    assert torch.equal(got_x, want_x)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_a_changed_or_other_input_is_cast_afresh() -> None:
    layer = nn.Linear(24, 8, bias=False)
    recast_linear_layers(nn.Sequential(layer))
    x = torch.randn(3, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = layer(x)
        x.mul_(2)  # in place: a new version of the same tensor
        second = layer(x)
        third = layer(x.clone())
    want = (x.bfloat16() @ layer.weight.bfloat16().t()).float()
    torch.testing.assert_close(second.float(), want, rtol=0, atol=0)
    torch.testing.assert_close(third.float(), want, rtol=0, atol=0)
    assert not torch.equal(first, second)


def test_inference_mode_under_autocast_runs() -> None:
    layer = nn.Linear(24, 8, bias=False)
    recast_linear_layers(nn.Sequential(layer))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(3, 24) * 1.0  # an inference tensor: it has no version counter
        out = layer(x)
    want = (x.bfloat16() @ layer.weight.bfloat16().t()).float()
    torch.testing.assert_close(out.float(), want, rtol=0, atol=0)
