"""Which GPUs serve vLLM and which train, on one node: split or colocated placement.

vLLM takes `--gpu-memory-utilization` (90% by default) of every GPU it sees, and a trainer
loading on the same GPU runs out of memory. A run with vLLM and a GPU trainer therefore states
its placement (`gpus:` in the run config):

- `split`: vLLM replicas on `engine` GPUs, the trainer on `trainer` GPUs, no GPU in both.
  Each replica sees only its slice of `engine` (`CUDA_VISIBLE_DEVICES`); the trainer's process
  sees only `trainer`.
- `colocated`: both on the same GPUs, taking turns: vLLM (started with `--enable-sleep-mode`)
  sleeps while the trainer steps, its weights parked in CPU memory and its KV cache freed, and
  wakes before the new weights are synced; a verl trainer parks its parameters and AdamW state
  in CPU memory outside the step (`param_offload`, `optimizer_offload`).

`check_placement` refuses what cannot work (overlap without colocation, counts that do not match
the replicas or trainer ranks, ids beyond the visible GPUs) with a message that names the key and
the fix; `preflight` calls it before anything loads.

Example:
    >>> GpuPlacement(mode="split", engine=[0], trainer=[1, 2]).memory_fraction()
    0.9
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal, Protocol, cast

from pydantic import Field, model_validator

from agentscope_rft.config_base import Section
from agentscope_rft.runtime.memory import release_freed_memory

if TYPE_CHECKING:
    import torch

    from agentscope_rft.config import RunConfig

logger = logging.getLogger(__name__)

_MEMORY_FLAG = "--gpu-memory-utilization"


class GpuPlacement(Section):
    """Where vLLM and the trainer run on this node's GPUs (vLLM engine + GPU trainer only)."""

    mode: Literal["split", "colocated"]
    """`split`: disjoint GPU lists; `colocated`: shared GPUs, vLLM asleep while the trainer
    steps."""
    engine: list[int] = Field(min_length=1)
    """GPU ids (as `nvidia-smi` numbers them) serving vLLM; replica i takes the i-th slice of
    tensor x pipeline parallel size GPUs."""
    trainer: list[int] = Field(min_length=1)
    """GPU ids the trainer uses: verl's `n_gpus_per_node` ranks, or the torch trainer's one GPU."""
    engine_memory_fraction: float | None = Field(default=None, gt=0, lt=1)
    """vLLM's `--gpu-memory-utilization` on its GPUs (weights + KV cache). Default: 0.9 split,
    0.5 colocated (the trainer's process keeps its CUDA context and buffers while vLLM runs)."""

    @model_validator(mode="after")
    def _distinct(self) -> GpuPlacement:
        for key, ids in (("engine", self.engine), ("trainer", self.trainer)):
            if len(set(ids)) != len(ids) or min(ids) < 0:
                raise ValueError(f"gpus.{key} {ids}: GPU ids must be distinct and >= 0")
        return self

    def memory_fraction(self) -> float:
        if self.engine_memory_fraction is not None:
            return self.engine_memory_fraction
        return 0.9 if self.mode == "split" else 0.5

    def replica_devices(self, replicas: int) -> list[list[int]]:
        """The GPUs of each vLLM replica: consecutive equal slices of `engine`."""
        per = len(self.engine) // replicas
        return [self.engine[i * per : (i + 1) * per] for i in range(replicas)]


class PlacementError(ValueError):
    """A GPU placement that cannot work; names the key and the fix."""


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_placement(config: RunConfig, visible_gpus: int | None = None) -> None:
    """Refuse a GPU layout that cannot work, before anything starts.

    `visible_gpus`: GPUs on this node (default: what torch sees; 0 skips the id range check and
    the unplaced-overlap check, as on a CPU machine).

    Raises:
        PlacementError: naming the key and the fix.

    Example:
        >>> check_placement(load_config("examples/web_search/config_gpu.yaml"), 8)  # doctest: +SKIP
    """
    placement, engine, trainer = config.gpus, config.engine, config.trainer
    vllm_here = engine.type == "vllm" and not engine.urls
    trainer_gpus = _trainer_gpus(config)
    if placement is None:
        visible = _visible_gpus() if visible_gpus is None else visible_gpus
        if vllm_here and trainer_gpus and visible:
            raise PlacementError(
                "vLLM and the trainer would load on the same GPUs (vLLM takes 90% of every GPU "
                "it sees); state the placement: `gpus: {mode: split, engine: [0], trainer: "
                "[1, ...]}` (disjoint GPUs) or `gpus: {mode: colocated, engine: [...], trainer: "
                "[...]}` (vLLM sleeps while the trainer steps)"
            )
        return
    if engine.type != "vllm" or not vllm_here:
        raise PlacementError(
            "gpus: places the vLLM servers this run starts; with engine.type "
            f"{engine.type!r} (or engine.urls set) remove it (the embedded engine uses "
            "engine.device)"
        )
    if config.runtime.type == "ray":
        raise PlacementError(
            "gpus: places vLLM and the trainer on this node (runtime: local); with runtime: ray "
            "Ray places the replicas (runtime.replica_gpus) and the trainer's ranks: remove gpus:"
        )
    if trainer.type == "verl" and trainer.nnodes > 1:
        raise PlacementError(
            "gpus: places one node; with trainer.nnodes > 1 Ray places the ranks and replicas "
            "(runtime: ray, runtime.replica_gpus): remove gpus:"
        )
    if any(a.split("=")[0] == _MEMORY_FLAG for a in engine.extra_args):
        raise PlacementError(
            f"engine.extra_args sets {_MEMORY_FLAG}; with gpus: set gpus.engine_memory_fraction"
        )
    per_replica = _replica_size(config)
    wanted = per_replica * engine.replicas
    if len(placement.engine) != wanted:
        raise PlacementError(
            f"gpus.engine lists {len(placement.engine)} GPUs; engine.replicas={engine.replicas} "
            f"x {per_replica} GPU(s) each (tensor x pipeline parallel) need {wanted}"
        )
    if len(placement.trainer) != trainer_gpus:
        key = "trainer.n_gpus_per_node" if trainer.type == "verl" else "the torch trainer"
        raise PlacementError(
            f"gpus.trainer lists {len(placement.trainer)} GPUs; {key} uses {trainer_gpus}"
        )
    shared = sorted(set(placement.engine) & set(placement.trainer))
    if placement.mode == "split" and shared:
        raise PlacementError(
            f"gpus.mode split, but GPU(s) {shared} are in both gpus.engine and gpus.trainer: "
            "vLLM would hold 90% of their memory while the trainer loads there. Give them "
            "disjoint lists, or set gpus.mode: colocated (vLLM sleeps while the trainer steps)"
        )
    if placement.mode == "colocated" and config.run.mode in ("one_step_off", "async"):
        raise PlacementError(
            f"gpus.mode colocated takes turns on the GPUs, but run.mode {config.run.mode!r} "
            "explores while the trainer steps: use run.mode: sync, or gpus.mode: split"
        )
    if placement.mode == "colocated" and trainer.type == "verl":
        missing = [k for k in ("param_offload", "optimizer_offload") if not getattr(trainer, k)]
        if missing:
            raise PlacementError(
                f"gpus.mode colocated with verl needs trainer.{' and trainer.'.join(missing)}: "
                "true (parameters and AdamW state leave the GPU while vLLM generates)"
            )
    visible = _visible_gpus() if visible_gpus is None else visible_gpus
    if visible:
        beyond = [g for g in placement.engine + placement.trainer if g >= visible]
        if beyond:
            raise PlacementError(
                f"gpus: GPU(s) {sorted(set(beyond))} do not exist here ({visible} visible)"
            )


def _trainer_gpus(config: RunConfig) -> int:
    """GPUs the trainer uses on this node (0: it runs on CPU)."""
    trainer = config.trainer
    if trainer.type == "verl":
        return trainer.n_gpus_per_node if trainer.device != "cpu" else 0
    return 1 if trainer.device != "cpu" else 0


def _replica_size(config: RunConfig) -> int:
    from agentscope_rft.engines.vllm_launch import VLLMLaunch

    assert config.engine.type == "vllm"
    return VLLMLaunch("m", "m", extra_args=tuple(config.engine.extra_args)).devices()


def restrict_trainer_gpus(placement: GpuPlacement | None) -> None:
    """Make this process (the trainer's, and Ray workers it starts) see only `gpus.trainer`.

    Called before anything initialises CUDA; vLLM replicas get their own list explicitly.
    """
    if placement is None:
        return
    value = ",".join(str(g) for g in placement.trainer)
    if os.environ.get("CUDA_VISIBLE_DEVICES") != value:
        logger.info("gpus.trainer: CUDA_VISIBLE_DEVICES=%s for the trainer's process", value)
        os.environ["CUDA_VISIBLE_DEVICES"] = value


class Sleeper(Protocol):
    """An engine that can free its GPU memory and take it back (the vLLM engine)."""

    async def sleep(self) -> None: ...

    async def wake_up(self) -> None: ...


@asynccontextmanager
async def room_for_training(
    engine: object,
    config: RunConfig,
    refill: Callable[[], Mapping[str, torch.Tensor]] | None = None,
) -> AsyncIterator[None]:
    """Around a trainer step, the engine gives its memory to the trainer where it can.

    Colocated GPUs: vLLM sleeps inside and wakes after (the weight sync that follows loads the
    new weights into the woken servers). A synchronous run on the embedded engine: its prefix and
    batch caches are freed first (their KV belongs to the weights the step replaces; the swap
    would drop them anyway) and the memory goes back to the OS, so the trainer's peak does not
    stack on the explorer's; an engine with its own copy of the weights frees that too and takes
    it from `refill()` (the trainer's weights) after the step.
    """
    if engine is None:  # a run without an engine (train_only)
        yield
        return
    placement = config.gpus
    if placement is not None and placement.mode == "colocated":
        sleeper = cast(Sleeper, engine)  # colocated placement is only accepted with vLLM
        await sleeper.sleep()
        try:
            yield
        finally:
            await sleeper.wake_up()
        return
    idle = getattr(engine, "idle_for_training", None)
    if idle is not None and config.run.mode == "sync":
        async with idle(refill):  # caches freed; held while the step writes weights it shares
            release_freed_memory()
            yield
            # the step's freed activations go back before the engine retakes a freed weight copy
            # (else the allocator's cache of them and the new copy add up to a higher peak)
            release_freed_memory()
        return
    yield
