"""Weights out of verl's engine: per-tensor stream, CPU state dict, HF folder, LoRA adapter folder.

Everything starts from `BaseEngine.get_per_tensor_param`, the generator verl's own weight sync
feeds to rollout engines. For full fine-tuning (and LoRA with `merge`) it yields full HF-named
tensors; for LoRA without merge it yields the adapter tensors under PEFT names plus the PEFT config
(`base_sync_done=True`), which is what a vLLM LoRA load needs. With FSDP each tensor is gathered
from its shards as it is yielded, so every rank must consume the whole stream in step.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist


class WeightMode(enum.StrEnum):
    FULL = "full"
    """Full HF weights (full fine-tuning, or LoRA merged into the base)."""
    LORA_ADAPTER = "lora_adapter"
    """Only the LoRA adapter tensors, PEFT-named."""


def weight_mode(engine: Any) -> WeightMode:
    config = engine.model_config
    if config.lora_rank > 0 and not config.lora.get("merge", False):
        return WeightMode.LORA_ADAPTER
    return WeightMode.FULL


def iter_weights(engine: Any) -> tuple[Iterator[tuple[str, torch.Tensor]], dict[str, Any] | None]:
    """(name, tensor) stream plus the PEFT config (None unless LoRA adapter mode)."""
    if weight_mode(engine) is WeightMode.LORA_ADAPTER:
        params, peft_config = engine.get_per_tensor_param(base_sync_done=True)
        return iter(params), peft_config
    params, _ = engine.get_per_tensor_param()
    return iter(params), None


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A full (unsharded) copy of a parameter; collective for FSDP2 DTensors. A shard parked in
    CPU memory (`param_offload`) is gathered on the device, as verl's own export does."""
    from torch.distributed.tensor import DTensor
    from verl.utils.device import get_device_id

    if isinstance(tensor, DTensor):
        moved = cast(DTensor, tensor.to(get_device_id()))  # `.to` keeps the DTensor type
        return moved.full_tensor()
    return tensor.detach()


def _merged_lora_stream(engine: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full weights with the LoRA delta merged, `W + (B @ A) * scaling` in the training
    dtype: the arithmetic of peft's `merge_adapter` (the torch trainer's export). verl's own merged
    stream casts to bf16, which an fp32 inference engine should not get. FSDP2 only."""
    from peft.tuners.lora import LoraLayer
    from verl.utils.fsdp_utils import normalize_peft_param_name
    from verl.utils.model import convert_weight_keys

    peft_model = getattr(engine.module, "_fsdp_wrapped_module", engine.module)
    adapted: dict[str, Any] = {}  # HF weight name -> its LoRA layer
    for module_name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and "default" in module.lora_A:
            names = normalize_peft_param_name({f"{module_name}.base_layer.weight": None})
            adapted[next(iter(names))] = module
    state = normalize_peft_param_name(peft_model.state_dict())
    hf_names = convert_weight_keys({name: name for name in state}, peft_model.get_base_model())
    for hf_name, name in hf_names.items():
        tensor = _full(state[name])
        layer = adapted.get(name)
        if layer is not None:
            lora_a = _full(layer.lora_A["default"].weight)
            lora_b = _full(layer.lora_B["default"].weight)
            tensor = tensor + ((lora_b @ lora_a) * layer.scaling["default"]).to(tensor.dtype)
        yield hf_name, tensor


def full_weights(engine: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF-named weights of the policy (LoRA merged in the training dtype), gathered tensor
    by tensor; collective under FSDP: every rank must consume the whole stream."""
    if engine.model_config.lora_rank > 0:
        return _merged_lora_stream(engine)
    params, _ = engine.get_per_tensor_param()
    return iter(params)


def export_state_dict(
    engine: Any, *, keep: bool = True, merged: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, dict[str, float]]:
    """Every tensor copied to CPU, the PEFT config, and timing metrics.

    Args:
        engine: verl's FSDP engine.
        keep: whether this rank keeps the copies; ranks with `keep=False` take part in the
            gathers (collective) and return an empty dict, so only one copy of a big model is
            made (rank 0's).
        merged: full HF weights with a LoRA adapter merged, instead of the `iter_weights` stream
            (the adapter alone in LoRA adapter mode).
    """
    started = time.perf_counter()
    peft_config = None
    if merged:
        params = full_weights(engine)
    else:
        params, peft_config = iter_weights(engine)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in params:
        if keep:
            state[name] = tensor.detach().to("cpu").clone()
    metrics = {
        "sync/export_s": time.perf_counter() - started,
        "sync/num_tensors": float(len(state)),
        "sync/mbytes": sum(t.numel() * t.element_size() for t in state.values()) / 2**20,
    }
    return state, peft_config, metrics


def save_hf_folder(
    engine: Any, tokenizer: Any, directory: str | Path, rank: int
) -> tuple[Path, dict[str, float]]:
    """Write a loadable HF model folder (config, tokenizer, safetensors; LoRA merged) on rank 0."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    state, _, metrics = export_state_dict(engine, keep=rank == 0, merged=True)
    out = Path(directory)
    started = time.perf_counter()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        with init_empty_weights():
            shell = AutoModelForCausalLM.from_config(engine.model_config.hf_config)
        shell.save_pretrained(out, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(out)
    dist.barrier()
    metrics["sync/save_s"] = time.perf_counter() - started
    return out, metrics


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def save_lora_adapter(
    engine: Any, directory: str | Path, rank: int
) -> tuple[Path, dict[str, float]]:
    """Write a PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`) on rank 0;
    the layout `PeftModel.from_pretrained` and vLLM's `/v1/load_lora_adapter` read."""
    from safetensors.torch import save_file

    if weight_mode(engine) is not WeightMode.LORA_ADAPTER:
        raise ValueError("save_lora_adapter needs lora_rank > 0 and lora_merge off")
    state, peft_config, metrics = export_state_dict(engine, keep=rank == 0)
    out = Path(directory)
    started = time.perf_counter()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state.items()}, out / "adapter_model.safetensors")
        (out / "adapter_config.json").write_text(json.dumps(_jsonable(peft_config), indent=2))
    dist.barrier()
    metrics["sync/save_s"] = time.perf_counter() - started
    return out, metrics
