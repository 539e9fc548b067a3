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
from typing import Any

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


def export_state_dict(
    engine: Any,
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, dict[str, float]]:
    """Every tensor copied to CPU (on every rank), the PEFT config, and timing metrics."""
    started = time.perf_counter()
    params, peft_config = iter_weights(engine)
    state = {name: tensor.detach().to("cpu").clone() for name, tensor in params}
    metrics = {
        "sync/export_s": time.perf_counter() - started,
        "sync/num_tensors": float(len(state)),
        "sync/mbytes": sum(t.numel() * t.element_size() for t in state.values()) / 2**20,
    }
    return state, peft_config, metrics


def save_hf_folder(
    engine: Any, tokenizer: Any, directory: str | Path, rank: int
) -> tuple[Path, dict[str, float]]:
    """Write a loadable HF model folder (config, tokenizer, safetensors) on rank 0."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    if weight_mode(engine) is not WeightMode.FULL:
        raise ValueError(
            "this run trains a LoRA adapter without merging: save the adapter with "
            "save_lora_adapter, or set lora_merge to export full HF weights"
        )
    state, _, metrics = export_state_dict(engine)
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
    state, peft_config, metrics = export_state_dict(engine)
    out = Path(directory)
    started = time.perf_counter()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state.items()}, out / "adapter_model.safetensors")
        (out / "adapter_config.json").write_text(json.dumps(_jsonable(peft_config), indent=2))
    dist.barrier()
    metrics["sync/save_s"] = time.perf_counter() - started
    return out, metrics
