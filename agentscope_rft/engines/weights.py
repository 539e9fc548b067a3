"""The embedded engine's weights: copied in at a weight swap, shared with the trainer, or freed
while the trainer steps.

All run in the engine thread between batcher steps (no row running); copying and sharing then
retake the weights' derived copies (oneDNN-packed and fused q/k/v, gate/up weights) through
`repack`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import PreTrainedModel

from agentscope_rft.engines.base import EngineError
from agentscope_rft.engines.packed import free_packs, repack

_FREED = "_agentscope_rft_freed_layouts"
ALIGNMENT = 64
"""Bytes: the boundary whose offset a freed weight keeps when it is allocated again."""


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` are the same memory (a weight the engine shares with the trainer)."""
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()
    )


def copy_weights(model: PreTrainedModel, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy `weights` into `model` in place (dtype/device converted); all names must match.
    A tensor the model already shares (`share_weights`) is not copied onto itself."""
    own = model.state_dict()
    missing = [name for name in own if name not in weights]
    tied_ok = {"lm_head.weight"} if model.config.get_text_config().tie_word_embeddings else set()
    missing = [m for m in missing if m not in tied_ok]
    unexpected = [name for name in weights if name not in own]
    if missing or unexpected:
        raise EngineError(
            f"weights do not match the engine's model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}",
            status=409,
        )
    reallocate(model)  # (weights freed while a trainer stepped: their memory first)
    own = model.state_dict()
    with torch.no_grad():
        for name, tensor in own.items():
            if name in weights and not same_storage(tensor, weights[name]):
                tensor.copy_(weights[name].to(device=tensor.device, dtype=tensor.dtype))
    repack(model)  # packed linear weights are copies: retake them from the new weights


def free_weights(model: PreTrainedModel) -> int:
    """Free the memory of `model`'s own weights and of their packed copies (the caller frees
    other derived copies, e.g. the fused decoder's); returns the bytes freed. The model cannot
    compute until `copy_weights` gives it weights again (it allocates them first). For an engine
    idle while the trainer steps: the sync after the step overwrites every weight anyway."""
    if getattr(model, _FREED, None) is not None:
        return 0
    layouts: dict[str, tuple[torch.Size, int]] = {}
    freed = free_packs(model)
    with torch.inference_mode(False), torch.no_grad():
        for name, param in model.named_parameters():  # tied weights once
            layouts[name] = (param.shape, param.data_ptr() % ALIGNMENT)
            freed += param.numel() * param.element_size()
            param.data = param.data.new_empty(0)
    setattr(model, _FREED, layouts)
    return freed


def reallocate(model: PreTrainedModel) -> None:
    """Give weights freed by `free_weights` their memory again (uninitialised: copy into them),
    each at the offset from a 64-byte boundary it had: CPU matmul kernels choose their code path
    by the operands' alignment, so the same values at another alignment give fp32 results that
    differ in the last bits (weights loaded from safetensors are views at the file's offsets)."""
    layouts = getattr(model, _FREED, None)
    if layouts is None:
        return
    with torch.inference_mode(False), torch.no_grad():
        for name, param in model.named_parameters():
            shape, offset = layouts[name]
            param.data = _allocated_at(param.data, shape, offset)
    delattr(model, _FREED)


def _allocated_at(like: torch.Tensor, shape: torch.Size, offset: int) -> torch.Tensor:
    """An uninitialised contiguous tensor of `shape` (dtype and device of `like`) whose data
    starts `offset` bytes past a 64-byte boundary."""
    size = like.element_size()
    numel = shape.numel()
    buffer = like.new_empty(numel + ALIGNMENT // size)
    shift = ((offset - buffer.data_ptr()) % ALIGNMENT) // size
    return buffer[shift : shift + numel].view(shape)


def _layout(tensor: torch.Tensor) -> str:
    return f"{tuple(tensor.shape)} {tensor.dtype} {tensor.device}"


def share_weights(model: PreTrainedModel, weights: Mapping[str, torch.Tensor]) -> int:
    """Make `model`'s parameters the tensors of `weights` (same names, shapes, dtype and device):
    the model then computes with them in place and its own copies are freed. Returns the bytes
    of the parameters now shared; raises `EngineError` (nothing changed) on any mismatch."""
    params = dict(model.named_parameters())  # tied weights once
    problems = [
        f"{name}: {_layout(p)} vs {_layout(weights[name]) if name in weights else 'missing'}"
        for name, p in params.items()
        if name not in weights or _layout(weights[name]) != _layout(p)
    ]
    if problems:
        raise EngineError(f"cannot share these weights: {'; '.join(problems[:3])}", status=409)
    shared = 0
    with torch.inference_mode(False), torch.no_grad():
        for name, param in params.items():
            param.data = weights[name].detach()
            shared += param.numel() * param.element_size()
    repack(model)  # packed and fused copies are retaken from the shared tensors
    return shared
