"""Linear layers under bf16 autocast that do not keep a bf16 copy of their weights for backward.

Under `torch.autocast`, a linear layer casts its fp32 weight to bf16 for the matmul and autograd
keeps that cast until backward (the input's gradient needs it): during every gradient pass a
second, bf16 copy of all the decoder's weights is alive beside the fp32 ones: 0.2 GiB for
SmolLM2-135M, 1 GB for a 0.5B model, 14 GB for a 7B one, on top of the pass's activations.
`recast_linear_layers` makes the decoder's linear layers keep their fp32 weight (alive anyway)
and cast it again in backward: each cast lives for one layer's matmul. The products are the same
bf16 matmuls of the same operands, the gradients come back in fp32 as autocast's do; the cost is
one more cast of the weights per pass (a few percent of a CPU step; memory bandwidth on a GPU).

Autocast also casts a layer's fp32 input for each layer that reads it and keeps every cast: the
query, key and value projections of a decoder layer keep three bf16 copies of the same normed
hidden states, the gate and up projections two. Here the layers reading one input share its cast
(`_cast_input`): two input casts kept per decoder layer instead of five (0.09 of the 2.86 GiB
alive at the peak of a quickstart step at 576-token passes; docs/benchmarks.md).

On CPU the matmuls also run on the pass's tokens padded with zero rows to a bucket
(`padded_rows`): oneDNN builds and caches a primitive (~0.6 MiB of kernels) for every matmul
shape it meets, and training passes come in as many token counts as there are micro-batches, so
without buckets its cache grew by 30-60 MB a step on the quickstart (up to its cap:
`runtime.memory.limit_kernel_cache`); with them a run meets a few dozen shapes per layer and
reuses them.
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Any

import torch
from torch import Tensor, nn


def padded_rows(rows: int) -> int:
    """`rows` rounded up to a bucket: a multiple of 64 up to 1,024 rows, of 128 up to 4,096,
    of 256 beyond (at most 1/8 more rows, ~6% on average for a pass of a few hundred tokens).

    Example:
        >>> padded_rows(12), padded_rows(704), padded_rows(1025), padded_rows(5000)
        (64, 704, 1152, 5120)
    """
    step = 64 if rows <= 1024 else 128 if rows <= 4096 else 256
    return -(-rows // step) * step


def _bucketed(t: Tensor) -> Tensor:
    """2-D `t` padded with zero rows to `padded_rows` on CPU (itself elsewhere: no kernel
    cache grows per shape there)."""
    return _padded(t, padded_rows(t.shape[0])) if t.device.type == "cpu" else t


def _padded(t: Tensor, rows: int) -> Tensor:
    """2-D `t` with zero rows appended up to `rows` (itself when it has them)."""
    if t.shape[0] == rows:
        return t
    out = t.new_zeros(rows, t.shape[1])
    out[: t.shape[0]] = t
    return out


_last_cast = threading.local()


def _cast_input(x: Tensor, dtype: torch.dtype) -> Tensor:
    """`x` in `dtype`, the cast shared with the layer before when it read the same `x`, unchanged
    (the q/k/v projections of one decoder layer; gate and up).

    The last cast is held weakly: it stays shared while a layer's backward keeps it (training);
    without a graph (no_grad) it is freed with its layer's output and the next layer casts again.
    """
    if x.dtype == dtype or x.is_inference():  # (an inference tensor has no version to check)
        return x.to(dtype)
    last = getattr(_last_cast, "entry", None)
    if last is not None:
        source, version, cast_ref = last
        cast = cast_ref()
        if source() is x and version == x._version and cast is not None and cast.dtype == dtype:
            return cast
    cast = x.to(dtype)
    _last_cast.entry = (weakref.ref(x), x._version, weakref.ref(cast))
    return cast


class _RecastLinear(torch.autograd.Function):
    """`linear(x, weight, bias)` in `dtype`, saving the uncast weight for backward; on CPU the
    matmuls run on the tokens padded to `padded_rows` (zero rows, sliced off)."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype
    ) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            x_cast = _cast_input(x, dtype)
            rows = x_cast.reshape(-1, x.shape[-1])
            bias_cast = None if bias is None else bias.to(dtype)
            out = nn.functional.linear(_bucketed(rows), weight.to(dtype), bias_cast)
        ctx.save_for_backward(x_cast, weight)
        ctx.dtype, ctx.input_dtype = dtype, x.dtype
        ctx.has_bias = bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        if out.shape[0] != rows.shape[0]:  # (a copy, not a view: callers may write in place)
            out = out[: rows.shape[0]].clone()
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        want_x, want_weight, want_bias = ctx.needs_input_grad[:3]
        grad_x = grad_weight = grad_bias = None
        with torch.autocast(grad_out.device.type, enabled=False):
            grads = grad_out.to(ctx.dtype).reshape(-1, grad_out.shape[-1])
            tokens = grads.shape[0]
            padded = _bucketed(grads)
            if want_x:
                grad_x = (padded @ weight.to(ctx.dtype))[:tokens]
                grad_x = grad_x.view(x.shape).to(ctx.input_dtype)
            if want_weight:
                inputs = _padded(x.reshape(-1, x.shape[-1]), padded.shape[0])
                grad_weight = (padded.t() @ inputs).to(weight.dtype)
            if want_bias and ctx.has_bias:
                grad_bias = grads.sum(dim=0).to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None


def _forward(self: nn.Linear, x: Tensor) -> Tensor:
    dtype = torch.get_autocast_dtype(x.device.type)
    if not torch.is_autocast_enabled(x.device.type) or self.weight.dtype == dtype:
        return nn.functional.linear(x, self.weight, self.bias)
    out: Tensor = _RecastLinear.apply(x, self.weight, self.bias, dtype)
    return out


def recast_linear_layers(model: nn.Module) -> int:
    """Make every `nn.Linear` in `model` cast its weight again in backward instead of keeping the
    cast (under autocast; outside it they run as before). Returns how many layers changed.

    Example:
        >>> layer = nn.Linear(4, 3)
        >>> recast_linear_layers(nn.Sequential(layer))
        1
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     out = layer(torch.randn(2, 4))
        >>> out.dtype, layer.weight.dtype
        (torch.bfloat16, torch.float32)
    """
    changed = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            changed += 1
    return changed
