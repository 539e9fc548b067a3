"""verl's FSDP training engine driven in-process, one optimizer step per call.

This wraps `verl.workers.engine_workers.TrainingWorker`, the role-free training worker (no rollout
engine is ever built) that verl's own SFT trainer drives in SPMD mode: every process of a
`torchrun` / `torch.multiprocessing` launch builds one `VerlTrainingEngine` with the same settings
and calls the same methods with the same full batch; each rank trains on its shard. (Ray actors:
see `ray_group.py`, same worker, verl's dispatch does the sharding.)

    engine = VerlTrainingEngine(settings, VerlLoss(my_loss, weighting="tokens"))
    batch = build_batch(samples, advantages, pad_token_id=..., multiple_of=engine.batch_multiple)
    metrics = engine.train_step(batch)
    weights = engine.state_dict_for_sync()      # HF names, full tensors, on CPU

verl APIs used: `TrainingWorker` (`set_loss_fn`, `reset`, `train_batch`, `infer_batch`,
`save_checkpoint`, `load_checkpoint`), its engine's `get_per_tensor_param` (HF-named full
tensors, the same stream verl's own rollout weight sync sends), and the config dataclasses
`HFModelConfig`, `FSDPEngineConfig`, `FSDPOptimizerConfig`, `CheckpointConfig`,
`TrainingWorkerConfig`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from tensordict import TensorDict

from agentscope_rft.trainers.verl import weights
from agentscope_rft.trainers.verl.compat import check_versions, ensure_trl_value_head_importable
from agentscope_rft.trainers.verl.convert import (
    num_trained_sequences,
    sequence_lengths,
    shard,
    to_engine_layout,
)
from agentscope_rft.trainers.verl.loss import NUM_SEQUENCES_KEY, NUM_TOKENS_KEY, EngineLoss

logger = logging.getLogger(__name__)

Device = Literal["cpu", "cuda"]


@dataclass(frozen=True, slots=True)
class VerlEngineSettings:
    """What the verl engine needs; the run config maps onto these fields one to one.

    Example:
        >>> VerlEngineSettings(model_path="/models/tiny", micro_batch_size=2).strategy
        'fsdp2'
    """

    model_path: str
    device: Device = "cpu"
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    micro_batch_size: int = 1
    """Rows per forward/backward on each rank (ignored when `max_tokens_per_micro_batch` is set)."""
    max_tokens_per_micro_batch: int | None = None
    """Token budget per micro-batch on each rank: verl's dynamic batching (`use_dynamic_bsz`)."""
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    total_steps: int = 1
    param_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Compute dtype of FSDP mixed precision; master weights and optimizer state stay fp32."""
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False
    remove_padding: bool = True
    """Pack the micro-batch into one sequence (verl's `use_remove_padding`)."""
    fsdp_size: int = -1
    """Ranks a parameter is sharded over (-1: all; smaller gives hybrid sharding)."""
    param_offload: bool = False
    optimizer_offload: bool = False
    seed: int = 0
    lora_rank: int = 0
    """0 trains all weights; > 0 trains a LoRA adapter of this rank (verl's FSDP LoRA)."""
    lora_alpha: int = 16
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    lora_merge: bool = False
    """Export LoRA runs as merged full weights instead of the adapter alone."""
    reference: bool = False
    """Keep the initial policy for reference log-probs (a second, frozen engine; LoRA runs use
    the policy with its adapter disabled instead)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_distributed(device: Device) -> tuple[int, int]:
    """Join (or start, for a single process) the default process group; returns (rank, world).

    verl's worker expects `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` in the environment, as
    torchrun and Ray set them; a plain single process gets rank 0 of 1 on a free local port.
    """
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if not dist.is_initialized():
        # verl's own initialiser would ask for "cpu:gloo,cpu:gloo" on CPU, which torch rejects.
        backend = "gloo" if device == "cpu" else "cpu:gloo,cuda:nccl"
        if device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(
            backend=backend,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    return dist.get_rank(), dist.get_world_size()


def prepare_verl(device: Device) -> dict[str, str]:
    """Version checks and the registrations verl needs before its engines are imported."""
    versions = check_versions()
    with warnings.catch_warnings():
        # verl warns once per optional engine it cannot import (megatron, torchtitan, ...)
        warnings.filterwarnings("ignore", message=".*engine is not available", category=UserWarning)
        if device == "cpu":
            from agentscope_rft.trainers.verl.platform import register_cpu_platform

            register_cpu_platform()
        import verl.workers.engine  # noqa: F401
    ensure_trl_value_head_importable()
    return versions


def _worker_config(settings: VerlEngineSettings) -> Any:
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import (
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
        TrainingWorkerConfig,
    )

    model_config = HFModelConfig(
        path=settings.model_path,
        override_config={"attn_implementation": settings.attn_implementation},
        enable_gradient_checkpointing=settings.gradient_checkpointing,
        use_remove_padding=settings.remove_padding,
        lora_rank=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        target_modules=(
            settings.lora_target_modules
            if isinstance(settings.lora_target_modules, str)
            else list(settings.lora_target_modules)
        ),
        lora={"merge": settings.lora_merge},
    )
    budget = settings.max_tokens_per_micro_batch
    engine_config = FSDPEngineConfig(
        strategy=settings.strategy,
        model_dtype="fp32",
        mixed_precision={
            "param_dtype": settings.param_dtype,
            "reduce_dtype": "fp32",
            "buffer_dtype": "fp32",
        },
        use_dynamic_bsz=budget is not None,
        micro_batch_size_per_gpu=settings.micro_batch_size,
        infer_micro_batch_size_per_gpu=settings.micro_batch_size,
        fsdp_size=settings.fsdp_size,
        param_offload=settings.param_offload,
        optimizer_offload=settings.optimizer_offload,
        use_torch_compile=False,
        seed=settings.seed,
        # verl annotates these `int` but defaults them to None (= no dynamic batching)
        max_token_len_per_gpu=budget,  # type: ignore[arg-type]
        infer_max_token_len_per_gpu=budget,  # type: ignore[arg-type]
    )
    optimizer_config = FSDPOptimizerConfig(
        lr=settings.lr,
        betas=settings.betas,
        weight_decay=settings.weight_decay,
        clip_grad=settings.max_grad_norm,
        lr_warmup_steps=settings.warmup_steps,
        total_training_steps=settings.total_steps,
        override_optimizer_config={"eps": settings.eps},
    )
    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        checkpoint_config=CheckpointConfig(),
    )


def worker_config(settings: VerlEngineSettings) -> Any:
    """verl's `TrainingWorkerConfig` for these settings (public for worker groups)."""
    return _worker_config(settings)


def reference_config(settings: VerlEngineSettings) -> Any:
    """The frozen reference engine's config: the policy's, without LoRA. On CUDA verl's
    `forward_only` mode keeps its parameters in pinned CPU memory between uses (as verl's own
    reference role does); on CPU there is nothing to offload to and pinning needs an accelerator.
    """
    import dataclasses

    config = _worker_config(dataclasses.replace(settings, lora_rank=0))
    if settings.device == "cuda":
        config.engine_config.forward_only = True
    return config


def step_meta(batch: TensorDict) -> dict[str, Any]:
    """Whole-batch values every rank's loss needs (token/sequence normalisers, MFU lengths)."""
    from verl.utils import tensordict_utils as tu

    return {
        NUM_TOKENS_KEY: int(batch["response_mask"].sum()),
        NUM_SEQUENCES_KEY: num_trained_sequences(batch),
        "global_token_num": tu.NonTensorData(sequence_lengths(batch)),
    }


def engine_batch(batch: TensorDict, pad_token_id: int, **meta: Any) -> TensorDict:
    """A padded batch (or one rank's shard of it) in verl's engine layout with `meta` attached."""
    from verl.utils import tensordict_utils as tu

    data = to_engine_layout(batch)
    tu.assign_non_tensor(data, pad_token_id=pad_token_id, **meta)
    return data


def reduce_metrics(raw: dict[str, Any]) -> dict[str, float]:
    """verl returns micro-batch lists (per rank); our loss metrics are shares, so they add up."""
    out: dict[str, float] = {}
    for name, value in raw.items():
        if name.startswith("perf/"):
            continue
        if isinstance(value, list):
            out[name] = float(sum(_flatten(value)))
        elif isinstance(value, int | float):
            out[name] = float(value)
    return out


def _flatten(values: list[Any]) -> list[float]:
    flat: list[float] = []
    for value in values:
        if isinstance(value, list):
            flat.extend(_flatten(value))
        else:
            flat.append(float(value))
    return flat


class VerlTrainingEngine:
    """One rank of verl's FSDP training engine (see module docstring).

    Example:
        >>> engine = VerlTrainingEngine(VerlEngineSettings(model_path=path), loss)  # doctest: +SKIP
        >>> engine.train_step(batch)["loss"]  # doctest: +SKIP
        0.0123
    """

    def __init__(self, settings: VerlEngineSettings, loss: EngineLoss) -> None:
        self.settings = settings
        self.versions = prepare_verl(settings.device)
        self.rank, self.world_size = init_distributed(settings.device)
        torch.manual_seed(settings.seed)
        from agentscope_rft.trainers.verl.worker import AgentscopeTrainingWorker

        started = time.perf_counter()
        self.worker = AgentscopeTrainingWorker(_worker_config(settings), device=settings.device)
        self.worker.set_loss_fn(loss)
        self.worker.reset()
        if settings.reference and settings.lora_rank == 0:
            self.worker.build_reference(reference_config(settings))
        self.engine = self.worker.engine
        self.dp_size = int(self.engine.get_data_parallel_size())
        self.dp_rank = int(self.engine.get_data_parallel_rank())
        self.tokenizer = self.worker.model_config.tokenizer
        self.steps = 0
        self.sync_metrics: dict[str, float] = {}
        if self.rank == 0:
            micro = (
                f"<= {settings.max_tokens_per_micro_batch} tokens"
                if settings.max_tokens_per_micro_batch is not None
                else f"{settings.micro_batch_size} rows"
            )
            logger.info(
                "verl %s engine: %s on %s, world %d, data-parallel %d, micro-batch %s per rank, "
                "param dtype %s, built in %.1fs (verl %s, torch %s, transformers %s)",
                settings.strategy,
                settings.model_path,
                settings.device,
                self.world_size,
                self.dp_size,
                micro,
                settings.param_dtype,
                time.perf_counter() - started,
                self.versions["verl"],
                self.versions["torch"],
                self.versions["transformers"],
            )

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    @property
    def batch_multiple(self) -> int:
        """A batch's row count must divide by this (ranks x rows per micro-batch)."""
        if self.settings.max_tokens_per_micro_batch is not None:
            return self.dp_size
        return self.dp_size * self.settings.micro_batch_size

    def _local_batch(self, batch: TensorDict, **meta: Any) -> TensorDict:
        local = shard(batch, self.dp_rank, self.dp_size)
        return engine_batch(local, self.pad_token_id, **step_meta(batch), **meta)

    def train_step(self, batch: TensorDict, **meta: Any) -> dict[str, float]:
        """One optimizer step on a padded batch (from `build_batch`); same batch on every rank.

        `meta` is attached to the batch for verl's engine and the loss function.

        Returns:
            `loss`, `grad_norm`, `lr`, the loss function's metrics (whole-batch values),
            `step_time_s`, `num_tokens` (trained), `num_sequences`.
        """
        from verl.utils import tensordict_utils as tu

        local = self._local_batch(batch, update_lr_scheduler=True, **meta)
        started = time.perf_counter()
        output = self.worker.train_batch(local)
        elapsed = time.perf_counter() - started
        self.steps += 1
        metrics = reduce_metrics(tu.get(output, "metrics") if output is not None else {})
        metrics.update(
            step_time_s=elapsed,
            num_tokens=float(batch["response_mask"].sum()),
            num_sequences=float(num_trained_sequences(batch)),
        )
        return metrics

    def compute_logprobs(
        self, batch: TensorDict, *, reference: bool = False, **meta: Any
    ) -> torch.Tensor:
        """Log-probs of every response token, [B, R] like `batch["responses"]`: the current
        policy's, or the reference policy's (needs `settings.reference` or LoRA)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        local = self._local_batch(batch, compute_loss=False, calculate_entropy=False, **meta)
        infer = self.worker.infer_reference if reference else self.worker.infer_batch
        output = infer(local)
        logprobs = no_padding_2_padding(tu.get(output, "log_probs"), local).float().cpu()
        if self.dp_size == 1:
            return logprobs
        parts: list[Any] = [None] * self.dp_size
        dist.all_gather_object(parts, logprobs, group=self.engine.get_data_parallel_group())
        return torch.cat(parts, dim=0)

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weight stream for an engine's per-tensor update (collective: every rank must
        consume all of it). Full HF-named tensors, or PEFT-named adapter tensors for LoRA."""
        params, _ = weights.iter_weights(self.engine)
        return params

    def state_dict_for_sync(self, *, merged: bool = False) -> dict[str, torch.Tensor]:
        """Exported weights on CPU, on rank 0 (other ranks get {}); timing in `sync_metrics`.

        The `iter_weights` stream, or with `merged` full HF weights (a LoRA adapter merged).
        """
        state, self.sync_metrics = self.worker.export_state_dict(merged=merged)
        return state

    def set_lr_schedule(self, factor: Any) -> None:
        """Drive the learning rate by `LambdaLR(optimizer, factor)` instead of verl's schedule."""
        self.worker.set_lr_schedule(factor)

    def save_hf(self, directory: str | Path) -> Path:
        """A loadable HF model folder (config, tokenizer, safetensors), written by rank 0."""
        self.sync_metrics = self.worker.save_hf(str(directory))
        return Path(directory)

    def save_lora_adapter(self, directory: str | Path) -> Path:
        """A PEFT adapter folder (LoRA runs without merge), written by rank 0."""
        self.sync_metrics = self.worker.save_lora_adapter(str(directory))
        return Path(directory)

    def save(self, directory: str | Path) -> None:
        """Model, optimizer and scheduler state (verl's sharded checkpoint) for resuming."""
        self.worker.save_checkpoint(str(directory), global_step=self.steps)

    def load(self, directory: str | Path) -> None:
        self.worker.load_checkpoint(str(directory))
