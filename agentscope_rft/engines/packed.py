"""Linear layers with oneDNN-packed weights for the embedded engine on CPU (bf16/fp16).

At the batch sizes of agent decoding (a few to a few dozen rows) a CPU bf16 `F.linear` runs far
below memory bandwidth: it multiplies against the plain row-major weight. oneDNN can pre-arrange
a weight once into the blocked layout its kernels read (`mkldnn._reorder_linear_weight`, what
`torch.compile` with freezing does on CPU), after which every call multiplies directly. Measured on
SmolLM2-135M's linear layers at 12 rows, bf16, one thread: 46.8 ms -> 26-30 ms per decode step,
outputs bit-identical to `F.linear`; a whole decode step 10-20 ms faster at every batch size
(`benchmarks/engine_decode.py`, docs/benchmarks.md). fp32 is left alone: packed
fp32 is faster too but rounds differently from the trainer's `F.linear`.

The packed copy is taken at start and again after every weight swap (`copy_weights` calls
`repack`), so it never serves old weights. It costs one more copy of the linear weights in memory.

Example:
    >>> pack_linear_weights(model)  # doctest: +SKIP
    211
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

PACKED_DTYPES = (torch.bfloat16, torch.float16)
_ATTR = "_agentscope_rft_packed"
_CALLBACKS = "_agentscope_rft_on_repack"


def packing_unsupported(model: nn.Module) -> str | None:
    """Why `model`'s linear layers are not packed (None: they are packable here)."""
    weight = next((m.weight for m in model.modules() if isinstance(m, nn.Linear)), None)
    if weight is None:
        return "no linear layers"
    if weight.device.type != "cpu":
        return f"on {weight.device.type} (packing is for CPU)"
    if weight.dtype not in PACKED_DTYPES:
        return f"{str(weight.dtype).removeprefix('torch.')} weights (packing is for bf16/fp16)"
    return packing_fails(weight.dtype)


_PROBED: dict[torch.dtype, str | None] = {}


def packing_fails(dtype: torch.dtype) -> str | None:
    """Why oneDNN-packed `dtype` linears do not work on this CPU (None: they do, bit-exactly).

    The packed bf16 kernels need AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; on other x86 CPUs the op
    raises, so it is probed once per dtype instead of assumed.
    """
    if dtype not in _PROBED:
        _PROBED[dtype] = _probe(dtype)
    return _PROBED[dtype]


def _probe(dtype: torch.dtype) -> str | None:
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    probe = nn.Linear(64, 48, dtype=dtype)
    x = torch.randn(5, 64, dtype=dtype)
    try:
        with torch.no_grad():
            packed = linear(x, pack(probe.weight), probe.bias)
            plain = probe(x)
    except Exception as exc:  # an op missing on this build or CPU
        return f"oneDNN packing failed here ({type(exc).__name__}: {exc})"
    if not torch.equal(packed, plain):
        return "packed results differ from F.linear on this CPU"
    return None


def pack_linear_weights(model: nn.Module) -> int:
    """Give every `nn.Linear` of `model` a packed weight and a forward that uses it.

    Returns the number of layers packed. The modules, their parameters and state-dict names stay
    as they are; only `forward` changes.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.dtype in PACKED_DTYPES:
            with torch.no_grad():
                setattr(module, _ATTR, pack(module.weight))
            module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
            count += 1
    return count


def repack(model: nn.Module) -> None:
    """Re-take the packed copy of every packed layer (after its weights changed in place), then
    run the callbacks registered with `on_repack` (other copies derived from the weights)."""
    with torch.no_grad():
        for module in model.modules():
            if getattr(module, _ATTR, None) is not None:
                setattr(module, _ATTR, pack(module.weight))  # type: ignore[arg-type]
    for callback in getattr(model, _CALLBACKS, []):
        callback()


def free_packs(model: nn.Module) -> int:
    """Free every packed copy of `model`'s layers until the next `repack` (which retakes them:
    the layers stay packed, nothing may compute meanwhile); returns the bytes freed."""
    freed = 0
    for module in model.modules():
        packed = getattr(module, _ATTR, None)
        if packed is not None:
            freed += packed.numel() * packed.element_size()
            setattr(module, _ATTR, packed.new_empty(0))
    return freed


def unpack(module: nn.Module) -> bool:
    """Drop `module`'s packed copy: it computes with its plain weight again. Returns whether it
    was packed."""
    if getattr(module, _ATTR, None) is None:
        return False
    delattr(module, _ATTR)
    del module.forward  # the packed forward set on the instance; the class's forward again
    return True


def on_repack(model: nn.Module, callback: Callable[[], None]) -> None:
    """Have `repack(model)` call `callback` (after the packed copies are retaken)."""
    callbacks = getattr(model, _CALLBACKS, None)
    if callbacks is None:
        callbacks = []
        setattr(model, _CALLBACKS, callbacks)
    callbacks.append(callback)


def packed_weight(module: nn.Module) -> torch.Tensor | None:
    """The packed copy of `module`'s weight (None when it is not packed)."""
    return getattr(module, _ATTR, None)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` ([out, in]) in oneDNN's blocked layout, for `linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with `weight` packed by `pack`."""
    if x.dim() == 2:  # the engine's own calls: no reshapes (a decode step makes 120 of these)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _packed_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and self.weight.requires_grad:  # never used for training
        return nn.functional.linear(x, self.weight, self.bias)
    return linear(x, getattr(self, _ATTR), self.bias)
