"""Check a verl trainer layout before any work starts, and say what was derived from it.

The run config gives the trainer's device count, FSDP strategy, micro-batch size and batch size;
`plan_layout` turns them into the data-parallel layout verl will use and rejects combinations that
would fail later (more GPUs than visible, batches that do not split into micro-batches, FSDP1 on
CPU) with a message that names the setting and the fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agentscope_rft.trainers.verl.engine import VerlEngineSettings

logger = logging.getLogger(__name__)


class VerlConfigError(ValueError):
    """A verl trainer setting that cannot work; raised before anything is built."""


@dataclass(frozen=True, slots=True)
class Layout:
    """How one optimizer step's batch spreads over the trainer's ranks."""

    num_devices: int
    dp_size: int
    rows_per_rank: int | None
    """None when the batch size is not known up front."""
    micro_batches_per_rank: int | None
    """None with dynamic (token-budget) micro-batching (verl decides per step), or when the batch
    size is not known."""
    sharding: str


def visible_cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_layout(
    settings: VerlEngineSettings,
    *,
    num_devices: int,
    batch_size: int | None,
    devices_per_node: int | None = None,
    num_nodes: int = 1,
) -> Layout:
    """Validate the trainer layout and log the derived values in one line.

    Args:
        settings: the engine settings (strategy, micro-batch, device, fsdp_size).
        num_devices: trainer ranks in total (GPUs, or CPU processes on CPU).
        batch_size: samples per optimizer step, as configured (None: not known; batches are then
            padded to a multiple of ranks x micro-batch at each step, with a log line).
        devices_per_node: GPUs visible per node; default: what this process sees.
        num_nodes: nodes the trainer spans (Ray placement); ranks are spread evenly.

    Raises:
        VerlConfigError: the layout cannot work; the message says which setting to change.

    Example:
        >>> s = VerlEngineSettings(model_path="m", device="cpu", micro_batch_size=2)
        >>> plan_layout(s, num_devices=2, batch_size=8).micro_batches_per_rank
        2
    """
    if num_devices < 1 or num_nodes < 1:
        raise VerlConfigError(f"trainer device count must be >= 1, got {num_devices}")
    if settings.micro_batch_size < 1:
        raise VerlConfigError(f"micro_batch_size must be >= 1, got {settings.micro_batch_size}")
    if settings.device == "cpu" and settings.strategy == "fsdp":
        raise VerlConfigError(
            "strategy 'fsdp' (FSDP1) cannot run on CPU: it syncs module states on the GPU; use "
            "strategy 'fsdp2' for device 'cpu'"
        )
    if settings.device == "cuda":
        per_node = visible_cuda_devices() if devices_per_node is None else devices_per_node
        needed = -(-num_devices // num_nodes)
        if per_node == 0:
            raise VerlConfigError(
                "trainer device is 'cuda' but no CUDA device is visible; set the trainer device "
                "to 'cpu' or check CUDA_VISIBLE_DEVICES"
            )
        if needed > per_node:
            raise VerlConfigError(
                f"the trainer asks for {num_devices} GPUs on {num_nodes} node(s) ({needed} per "
                f"node) but only {per_node} are visible per node; lower the trainer GPU count or "
                "add nodes"
            )
    if settings.fsdp_size == 0 or settings.fsdp_size < -1:
        raise VerlConfigError(f"fsdp_size must be -1 (all ranks) or >= 1, got {settings.fsdp_size}")
    if settings.fsdp_size > 0 and num_devices % settings.fsdp_size:
        raise VerlConfigError(
            f"fsdp_size {settings.fsdp_size} must divide the trainer device count {num_devices}"
        )
    dp_size = num_devices  # no sequence/tensor parallelism in this backend (yet)
    if batch_size is not None and batch_size % dp_size:
        raise VerlConfigError(
            f"batch_size {batch_size} does not split across {dp_size} data-parallel ranks; use a "
            f"multiple of {dp_size}"
        )
    rows = batch_size // dp_size if batch_size is not None else None
    micro: int | None = None
    if settings.max_tokens_per_micro_batch is None and rows is not None:
        if rows % settings.micro_batch_size:
            raise VerlConfigError(
                f"batch_size {batch_size} gives {rows} samples per rank, which micro_batch_size "
                f"{settings.micro_batch_size} does not divide; use a batch_size that is a multiple "
                f"of {dp_size * settings.micro_batch_size} or a micro_batch_size dividing {rows}"
            )
        micro = rows // settings.micro_batch_size
    shard_over = num_devices if settings.fsdp_size < 0 else min(settings.fsdp_size, num_devices)
    replicas = num_devices // shard_over
    sharding = f"{settings.strategy} full shard over {shard_over}"
    if replicas > 1:
        sharding = f"{settings.strategy} hybrid: shard over {shard_over}, replicate x{replicas}"
    layout = Layout(num_devices, dp_size, rows, micro, sharding)
    if settings.max_tokens_per_micro_batch is not None:
        micro_text = f"micro-batches of <= {settings.max_tokens_per_micro_batch} tokens"
    elif micro is not None:
        micro_text = f"{micro} micro-batch(es) of {settings.micro_batch_size}"
    else:
        micro_text = f"micro-batches of {settings.micro_batch_size} rows"
    per_step = (
        f"{batch_size} samples per step -> {rows} per rank"
        if batch_size is not None
        else "batches padded to a multiple of ranks x micro-batch"
    )
    logger.info(
        "verl layout: %d %s rank(s) on %d node(s), %s; %s -> %s",
        num_devices,
        settings.device,
        num_nodes,
        sharding,
        per_step,
        micro_text,
    )
    return layout
