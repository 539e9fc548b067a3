"""Chunked log-probs and entropy equal the unchunked computation, values and gradients (fp32)."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from agentscope_rft.trainers.logprobs import chunk_tokens_for, token_logprobs_entropy


def _reference(hidden, weight, bias, targets, temperature):
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    logp = (logits.float() / temperature.unsqueeze(-1)).log_softmax(dim=-1)
    token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token, entropy


def _inputs(seed: int, bias: bool):
    gen = torch.Generator().manual_seed(seed)
    tokens, width, vocab = 37, 16, 301
    hidden = torch.randn(tokens, width, generator=gen, dtype=torch.float64).float()
    weight = (torch.randn(vocab, width, generator=gen) * 0.5).requires_grad_()
    b = (torch.randn(vocab, generator=gen) * 0.1).requires_grad_() if bias else None
    targets = torch.randint(vocab, (tokens,), generator=gen)
    temperature = torch.rand(tokens, generator=gen) + 0.5
    return hidden.requires_grad_(), weight, b, targets, temperature


@pytest.mark.parametrize("keep_bytes", [0, 2**30])  # recompute in backward / keep log-probs
@pytest.mark.parametrize("chunk", [1, 5, 37, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_equals_unchunked_values_and_gradients(
    chunk: int, bias: bool, keep_bytes: int
) -> None:
    hidden, weight, b, targets, temperature = _inputs(0, bias)
    gen = torch.Generator().manual_seed(1)
    g_lp, g_ent = torch.randn(37, generator=gen), torch.randn(37, generator=gen)

    # The reference runs in float64: the unchunked fp32 formula is itself only fp32-accurate.
    params = [hidden, weight] + ([b] if b is not None else [])
    wide = [p.detach().double().requires_grad_() for p in params]
    ref_lp, ref_ent = _reference(
        *wide[:2], wide[2] if b is not None else None, targets, temperature.double()
    )
    ref_grads = torch.autograd.grad(
        (ref_lp * g_lp.double()).sum() + (ref_ent * g_ent.double()).sum(), wide
    )

    lp, ent = token_logprobs_entropy(
        hidden, weight, b, targets, temperature, chunk_tokens=chunk, keep_bytes=keep_bytes
    )
    grads = torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), params)

    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent.float(), rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=5e-6)


def test_chunk_size_does_not_change_results() -> None:
    hidden, weight, _, targets, temperature = _inputs(2, False)
    whole = token_logprobs_entropy(hidden, weight, None, targets, temperature, chunk_tokens=37)
    for chunk in (1, 4, 16):
        parts = token_logprobs_entropy(
            hidden, weight, None, targets, temperature, chunk_tokens=chunk
        )
        torch.testing.assert_close(parts[0], whole[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(parts[1], whole[1], rtol=1e-6, atol=1e-6)


def test_logprob_gradient_alone_and_entropy_gradient_alone() -> None:
    hidden, weight, _, targets, temperature = _inputs(3, False)
    wide = [hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()]
    ref_lp, ref_ent = _reference(*wide, None, targets, temperature.double())
    lp, ent = token_logprobs_entropy(
        hidden, weight, None, targets, temperature, chunk_tokens=8, keep_bytes=0
    )
    for got, want in ((lp, ref_lp), (ent, ref_ent)):
        g_got = torch.autograd.grad(got.sum(), [hidden, weight], retain_graph=True)
        g_want = torch.autograd.grad(want.sum(), wide, retain_graph=True)
        for a, b in zip(g_got, g_want, strict=True):
            torch.testing.assert_close(a, b.float(), rtol=1e-5, atol=5e-6)


def test_no_grad_pass_and_bf16_matmul() -> None:
    hidden, weight, _, targets, temperature = _inputs(4, False)
    with torch.no_grad():
        lp, ent = token_logprobs_entropy(
            hidden.bfloat16(), weight.bfloat16(), None, targets, temperature, chunk_tokens=10
        )
        ref_lp, ref_ent = _reference(
            hidden.bfloat16(), weight.bfloat16(), None, targets, temperature
        )
    assert not lp.requires_grad
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-6)


def test_chunk_tokens_for_vocabulary() -> None:
    assert chunk_tokens_for(49152) * 49152 * 4 <= 64 * 2**20
    assert chunk_tokens_for(10**9) == 16


def test_bf16_matmul_fp32_weight_gets_the_fp32_sum_of_its_gradient() -> None:
    # The weight stays fp32 (the trainer's master copy): its gradient is the fp32 sum over chunks
    # that a bf16 weight's gradient is the rounding of.
    hidden, weight, _, targets, temperature = _inputs(5, False)
    h16 = hidden.detach().bfloat16().requires_grad_()
    w16 = weight.detach().bfloat16().requires_grad_()
    ours = token_logprobs_entropy(h16, weight, None, targets, temperature, chunk_tokens=8)
    cast = token_logprobs_entropy(h16, w16, None, targets, temperature, chunk_tokens=8)
    assert torch.equal(ours[0], cast[0]) and torch.equal(ours[1], cast[1])
    (g_weight,) = torch.autograd.grad((ours[0] + ours[1]).sum(), [weight])
    (g_cast,) = torch.autograd.grad((cast[0] + cast[1]).sum(), [w16])
    assert g_weight.dtype == torch.float32 and g_cast.dtype == torch.bfloat16
    assert torch.equal(g_weight.bfloat16(), g_cast)


class _LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensors that ops create while the mode is on (each storage once)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def _freed(self, ptr: int, size: int) -> None:
        self._seen.discard(ptr)
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t._base is None:
                storage = t.untyped_storage()
                ptr, size = storage.data_ptr(), storage.nbytes()
                if ptr and ptr not in self._seen:
                    self._seen.add(ptr)
                    self.live += size
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t, self._freed, ptr, size)
        return out


@pytest.mark.parametrize("keep_bytes", [0, 2**30])
def test_backward_holds_two_chunk_blocks_at_most(keep_bytes: int) -> None:
    gen = torch.Generator().manual_seed(6)
    tokens, width, vocab, chunk = 64, 8, 4096, 16
    hidden = torch.randn(tokens, width, generator=gen).bfloat16().requires_grad_()
    weight = torch.randn(vocab, width, generator=gen).requires_grad_()
    targets = torch.randint(vocab, (tokens,), generator=gen)
    lp, ent = token_logprobs_entropy(
        hidden,
        weight,
        None,
        targets,
        torch.ones(tokens),
        chunk_tokens=chunk,
        keep_bytes=keep_bytes,
    )
    loss = (lp + ent).sum()
    with _LiveBytes() as live:
        loss.backward()
    block = 4 * chunk * vocab  # one fp32 [chunk, vocab] block
    grad_weight = 4 * vocab * width  # the fp32 accumulator
    cast = 2 * vocab * width  # the weight in bf16 for the matmuls (and one bf16 product)
    assert live.peak <= 2 * block + grad_weight + cast + 16 * 1024
