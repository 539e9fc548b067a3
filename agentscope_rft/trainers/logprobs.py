"""Token log-probs and entropy through the vocabulary projection, in chunks of tokens.

The straightforward way (`log_softmax(lm_head(hidden) / T)`, then gather and `-(p * logp).sum()`)
materialises [tokens, vocab] in fp32 several times over and keeps them for backward: logits,
scaled logits, log-probs, probabilities and their product. With SmolLM2's 49k vocabulary that is
~1 GB per 1,000 trained tokens; with Qwen2.5's 152k, three times that. Here the projection runs
over chunks of tokens, and backward recomputes each chunk's logits instead of keeping them: only
[tokens] fp32 statistics (log-sum-exp, entropy) are saved, and at most one
[chunk, vocab] block lives at a time. The cost is one extra projection matmul per chunk; a pass
small enough (`KEEP_BYTES`) keeps its fp32 log-probs once instead and skips the recompute.

Gradient of the per-token outputs with respect to the scaled logits z = logits / T, p = softmax(z):
  d logp(y) / dz = onehot(y) - p
  d H / dz       = -p * (z - E_p[z]) = -p * (logp + H)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

CHUNK_BYTES = 64 * 2**20
"""Size of the fp32 [chunk, vocab] block computed at a time (a few such temporaries coexist)."""
KEEP_BYTES = 256 * 2**20
"""A pass whose [tokens, vocab] fp32 log-probs fit in this keeps them (once) for backward instead
of recomputing the projection: small passes stay as fast as the unchunked computation."""


def chunk_tokens_for(vocab_size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk so one fp32 [chunk, vocab] block takes `chunk_bytes`.

    Example:
        >>> chunk_tokens_for(49152)
        341
    """
    return max(16, chunk_bytes // (4 * vocab_size))


def _chunk_logits(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: Tensor
) -> Tensor:
    """Scaled fp32 logits [c, V] of hidden [c, H] (matmul in the inputs' dtype)."""
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    return logits.float().div_(temperature.unsqueeze(-1))  # (in place: a fresh tensor)


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: Tensor,
        chunk: int,
        keep: bool,
    ) -> tuple[Tensor, Tensor]:
        tokens = hidden.shape[0]
        logprobs = hidden.new_empty(tokens, dtype=torch.float32)
        entropy = hidden.new_empty(tokens, dtype=torch.float32)
        lse = hidden.new_empty(tokens, dtype=torch.float32)
        kept: list[Tensor] = []
        w, b = _cast(weight, bias, hidden.dtype)  # (a temporary: backward casts again)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, tokens, chunk):
                end = min(start + chunk, tokens)
                logp = _chunk_logits(hidden[start:end], w, b, temperature[start:end])
                chunk_lse = logp.logsumexp(dim=-1)  # [c]
                logp.sub_(chunk_lse.unsqueeze(-1))  # [c, V] log-probs, in place of the logits
                logprobs[start:end] = logp.gather(-1, targets[start:end].unsqueeze(-1)).squeeze(-1)
                entropy[start:end] = -logp.exp().mul_(logp).sum(dim=-1)
                lse[start:end] = chunk_lse
                if keep:
                    kept.append(logp)
        ctx.save_for_backward(hidden, weight, bias, targets, temperature, lse, entropy)
        ctx.chunk = chunk
        ctx.kept = kept
        ctx.set_materialize_grads(False)
        return logprobs, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, temperature, lse, entropy = ctx.saved_tensors
        if grad_logprobs is None and grad_entropy is None:
            return (None,) * 7
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        # Gradients accumulate in fp32 and come back in the weights' own dtype: an fp32 master
        # weight gets the fp32 sum over chunks, not a bf16 rounding of it.
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        grad_bias = (
            torch.zeros_like(bias, dtype=torch.float32) if want_bias and bias is not None else None
        )
        g_lp = grad_logprobs if grad_logprobs is not None else torch.zeros_like(lse)
        w, b = _cast(weight, bias, hidden.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for index, start in enumerate(range(0, hidden.shape[0], ctx.chunk)):
                end = min(start + ctx.chunk, hidden.shape[0])
                h = hidden[start:end]
                if ctx.kept:
                    logp = ctx.kept[index]
                    ctx.kept[index] = None  # (this chunk's only use: overwritten below)
                else:
                    logp = _chunk_logits(h, w, b, temperature[start:end])
                    logp.sub_(lse[start:end].unsqueeze(-1))  # [c, V]
                grad_logits = _chunk_grad(
                    logp,
                    g_lp[start:end],
                    None if grad_entropy is None else grad_entropy[start:end],
                    entropy[start:end],
                    targets[start:end],
                    temperature[start:end],
                ).to(hidden.dtype)  # (the [c, V] fp32 blocks are gone before the matmuls)
                del logp
                if grad_hidden is not None:
                    grad_hidden[start:end] = grad_logits @ w
                if grad_weight is not None:
                    grad_weight.add_(grad_logits.t() @ h)  # (no fp32 copy of the product)
                if grad_bias is not None:
                    grad_bias.add_(grad_logits.sum(dim=0, dtype=torch.float32))
                del grad_logits  # (not alive beside the next chunk's blocks)
        ctx.kept = []
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None,
            None,
            None,
            None,
        )


def _cast(weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """The projection in the matmul's dtype (the tensors themselves when already in it)."""
    return weight.to(dtype), None if bias is None else bias.to(dtype)


def _chunk_grad(
    logp: Tensor,
    g_lp: Tensor,
    g_ent: Tensor | None,
    entropy: Tensor,
    targets: Tensor,
    temperature: Tensor,
) -> Tensor:
    """The gradient [c, V] fp32 with respect to one chunk's logits, computed in place of its
    log-probs `logp` (which it overwrites) with one more [c, V] block for the probabilities:
    grad_z = -p * (g_lp + g_H * (logp + H)) + onehot(y) * g_lp, divided by the temperature."""
    g = g_lp.unsqueeze(-1)  # [c, 1]
    if g_ent is not None:
        probs = logp.exp()
        grad_z = logp.mul_(g_ent.unsqueeze(-1))
        grad_z.add_(g + g_ent.unsqueeze(-1) * entropy.unsqueeze(-1))
        grad_z.mul_(probs).neg_()
        del probs
    else:
        grad_z = logp.exp_().mul_(-g)
    grad_z.scatter_add_(-1, targets.unsqueeze(-1), g)
    return grad_z.div_(temperature.unsqueeze(-1))


def token_logprobs_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    temperature: Tensor,
    *,
    chunk_tokens: int | None = None,
    keep_bytes: int = KEEP_BYTES,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target token and the entropy of each position's distribution.

    `softmax((hidden @ weight.T + bias) / temperature)` per row, computed `chunk_tokens` rows at a
    time (default: a 64 MiB fp32 block); the matmul runs in `hidden`'s dtype, the softmax in
    fp32. Differentiable in `hidden`, `weight` and `bias`. When grad is on, backward reuses the
    chunks' log-probs if all of them take at most `keep_bytes` (held once, fp32), else recomputes
    each chunk's logits.

    Args:
        hidden: [M, H] final hidden states of the positions that predict `targets`.
        weight: [V, H] output projection, any dtype (cast to `hidden`'s for the matmuls, a
            temporary; its gradient comes back in its own dtype, summed over chunks in fp32).
        bias: [V] or None (likewise).
        targets: [M] token ids.
        temperature: [M] sampling temperature of each position.
        chunk_tokens: rows per chunk.
        keep_bytes: keep the log-probs for backward up to this size ([M, V] fp32).

    Returns:
        (logprobs [M], entropy [M]), fp32.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> h, w = torch.randn(5, 8, generator=g), torch.randn(11, 8, generator=g)
        >>> lp, ent = token_logprobs_entropy(h, w, None, torch.arange(5), torch.ones(5))
        >>> direct = (h @ w.T).log_softmax(-1)[torch.arange(5), torch.arange(5)]
        >>> bool(torch.allclose(lp, direct, atol=1e-5))  # fp32 sums in another order
        True
    """
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0])
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )
    keep = grad and hidden.shape[0] * weight.shape[0] * 4 <= keep_bytes
    logprobs, entropy = _TokenLogProbs.apply(
        hidden, weight, bias, targets, temperature, chunk, keep
    )
    return logprobs, entropy
