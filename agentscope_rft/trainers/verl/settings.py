"""From `trainer: {type: verl, ...}` to the engine settings, checked before anything starts.

Every check that can fail without building a model runs here, first: the verl/torch/transformers
versions, the algorithm (what this backend can train), LoRA options, the device and rank layout
(`plan_layout`). Each derived value is logged in one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import VerlTrainerConfig
from agentscope_rft.trainers.verl.compat import check_versions
from agentscope_rft.trainers.verl.engine import Device, VerlEngineSettings
from agentscope_rft.trainers.verl.placement import Layout, VerlConfigError, plan_layout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerlPlan:
    """The engine settings and rank layout of a verl trainer, and where its ranks run."""

    settings: VerlEngineSettings
    layout: Layout
    use_ray: bool
    """More than one rank: Ray actors (verl's `RayWorkerGroup`); one rank: in-process."""


def _device(config: VerlTrainerConfig) -> Device:
    if config.device != "auto":
        return config.device
    import torch

    device: Device = "cuda" if torch.cuda.is_available() else "cpu"
    logger.info("verl trainer: device auto -> %s", device)
    return device


def _param_dtype(config: VerlTrainerConfig, device: Device) -> Literal["fp32", "bf16"]:
    if config.dtype == "float32":
        return "fp32"
    if config.dtype == "bfloat16":
        return "bf16"
    chosen: Literal["fp32", "bf16"] = "bf16" if device == "cuda" else "fp32"
    logger.info(
        "verl trainer: dtype auto -> %s compute on %s (fp32 weights and optimizer)", chosen, device
    )
    return chosen


def check_algorithm(config: VerlTrainerConfig, algorithm: AlgorithmConfig) -> None:
    """What this backend cannot train, said up front."""
    if algorithm.needs_critic():
        raise VerlConfigError(
            f"advantage {algorithm.advantage.type!r} needs a critic (value head), which the verl "
            "trainer does not train; use `trainer: {type: torch}` or a critic-free estimator "
            "(grpo, rloo, reinforce_plus_plus, ...)"
        )
    if algorithm.objective == "dpo":
        raise VerlConfigError(
            "objective 'dpo' needs both samples of a pair in one micro-batch, which verl's "
            "micro-batching does not guarantee; use `trainer: {type: torch}` for DPO"
        )
    if config.lora is not None:
        if config.lora.dropout:
            raise VerlConfigError(
                f"trainer.lora.dropout {config.lora.dropout}: verl's FSDP LoRA has no dropout; "
                "set it to 0"
            )
        if config.strategy == "fsdp":
            raise VerlConfigError(
                "LoRA with strategy 'fsdp' (FSDP1) is not supported by this trainer's weight "
                "export; use strategy 'fsdp2'"
            )


def check_attention(config: VerlTrainerConfig, device: Device) -> None:
    """`flash_attention_2` fails inside verl's model build otherwise, as a traceback per rank."""
    if config.attn_implementation != "flash_attention_2":
        return
    if device != "cuda":
        raise VerlConfigError(
            f"trainer.attn_implementation 'flash_attention_2' needs CUDA and the trainer runs on "
            f"{device}; use 'sdpa' (the default)"
        )
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        raise VerlConfigError(
            "trainer.attn_implementation 'flash_attention_2' needs the flash-attn package, which "
            "is not installed: pip install flash-attn --no-build-isolation, or use 'sdpa' (the "
            "default)"
        )


def plan(
    config: VerlTrainerConfig,
    model_path: str,
    algorithm: AlgorithmConfig,
    *,
    optimizer_steps: int,
    seed: int,
    batch_size: int | None = None,
) -> VerlPlan:
    """Check the config and derive the engine settings, before any model or process starts.

    Args:
        config: the `trainer:` section.
        model_path: the policy's HF folder.
        algorithm: the `algorithm:` section (some need what this backend does not have).
        optimizer_steps: optimizer steps in the whole run (the LR schedule's length).
        seed: the run's seed.
        batch_size: nominal samples per training step, when known: each mini-batch of it must
            split into ranks x `micro_batch_size`.

    Raises:
        VerlVersionError: verl, torch or transformers outside the supported combination.
        VerlConfigError: a setting that cannot work; the message names it and the fix.

    Example:
        >>> plan(VerlTrainerConfig(device="cpu"), "/models/tiny", AlgorithmConfig(),
        ...      optimizer_steps=10, seed=0).use_ray  # doctest: +SKIP
        False
    """
    check_versions()
    check_algorithm(config, algorithm)
    device = _device(config)
    check_attention(config, device)
    if config.micro_batch_size is None:
        logger.info(
            "verl trainer: micro_batch_size not set -> micro-batches of <= %d tokens per rank "
            "(trainer.micro_batch_tokens, verl dynamic batching)",
            config.micro_batch_tokens,
        )
    lora = config.lora
    targets: str | tuple[str, ...] = "all-linear"
    if lora is not None and not isinstance(lora.target_modules, str):
        targets = tuple(lora.target_modules)
    settings = VerlEngineSettings(
        model_path=str(model_path),
        device=device,
        strategy=config.strategy,
        micro_batch_size=config.micro_batch_size or 1,
        max_tokens_per_micro_batch=None if config.micro_batch_size else config.micro_batch_tokens,
        lr=config.lr,
        betas=config.betas,
        weight_decay=config.weight_decay,
        max_grad_norm=config.grad_clip or float("inf"),
        total_steps=optimizer_steps,
        param_dtype=_param_dtype(config, device),
        attn_implementation=config.attn_implementation,
        gradient_checkpointing=config.gradient_checkpointing,
        remove_padding=config.remove_padding,
        fsdp_size=config.fsdp_size,
        param_offload=config.param_offload,
        optimizer_offload=config.optimizer_offload,
        seed=seed,
        lora_rank=lora.rank if lora else 0,
        lora_alpha=lora.alpha if lora else 16,
        lora_target_modules=targets,
        reference=algorithm.needs_reference(),
    )
    per_step = None
    if batch_size is not None:
        if batch_size % config.mini_batches:
            raise VerlConfigError(
                f"the batch of {batch_size} samples does not split into trainer.mini_batches "
                f"{config.mini_batches}; use a divisor of {batch_size}"
            )
        per_step = batch_size // config.mini_batches
    layout = plan_layout(
        settings,
        num_devices=config.world_size,
        batch_size=per_step,
        devices_per_node=None if config.nnodes == 1 else config.n_gpus_per_node,
        num_nodes=config.nnodes,
    )
    use_ray = config.world_size > 1
    unused = [f"ray.{k}" for k in ("address", "num_cpus") if getattr(config.ray, k) is not None]
    if not use_ray and unused:
        logger.warning(
            "verl trainer: trainer.%s not used: one rank runs in this process without Ray (it "
            "is for n_gpus_per_node x nnodes > 1)",
            " and trainer.".join(unused),
        )
    logger.info(
        "verl trainer: %d rank(s) -> %s",
        config.world_size,
        "Ray actors (verl RayWorkerGroup)" if use_ray else "in this process",
    )
    return VerlPlan(settings, layout, use_ray)
