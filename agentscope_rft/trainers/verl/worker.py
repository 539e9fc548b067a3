"""verl's `TrainingWorker` plus what our trainer needs, usable in-process or as a Ray actor of a
`RayWorkerGroup`: weight export, our LR schedule, and reference-policy log-probs.

The extra methods are registered with verl's own `register(dispatch_mode=...)` decorator, the
extension point of its single-controller workers, so a worker group dispatches them to all ranks.
Import this module only after `engine.prepare_verl(device)` (or, in a worker process, with the CPU
plugin in `VERL_USE_EXTERNAL_MODULES`): it imports verl's engines, which read the platform.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import (
    Dispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.workers.engine_workers import TrainingWorker

from agentscope_rft.trainers.verl import weights
from agentscope_rft.trainers.verl.engine import Device, init_distributed, prepare_verl

# verl registers its dispatch modes at run time (a DynamicEnum), invisible to type checkers.
ONE_TO_ALL = getattr(Dispatch, "ONE_TO_ALL")  # noqa: B009


class AgentscopeTrainingWorker(TrainingWorker):
    """A verl training worker (no rollout engine) with weight export, our LR schedule and an
    optional frozen reference policy."""

    def __init__(self, config: Any, device: Device = "cuda") -> None:
        prepare_verl(device)  # no-op when the in-process engine already did it
        if device == "cpu":
            # verl's own process-group initialiser asks torch for "cpu:gloo,cpu:gloo" on CPU.
            init_distributed("cpu")
        super().__init__(config)
        self.reference: TrainingWorker | None = None

    @register(dispatch_mode=ONE_TO_ALL)
    def build_reference(self, config: Any) -> None:
        """A frozen copy of the initial policy (a second engine, sharded like the policy) for
        reference log-probs. LoRA runs need none: the policy with its adapter disabled is it."""
        self.reference = TrainingWorker(config)
        self.reference.reset()

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"))
    def infer_reference(self, data: TensorDict) -> TensorDict | None:
        """Reference-policy log-probs, as `infer_batch` returns them for the policy."""
        if self.reference is not None:
            return self.reference.infer_batch(data)
        from verl.utils import tensordict_utils as tu

        tu.assign_non_tensor(data, no_lora_adapter=True)
        return self.infer_batch(data)

    @register(dispatch_mode=ONE_TO_ALL)
    def set_lr_schedule(self, factor: Any) -> None:
        """Replace verl's scheduler by `LambdaLR(factor)` (our schedule, one source of truth);
        verl's checkpoints then save and restore this one."""
        engine: Any = self.engine
        scheduler = torch.optim.lr_scheduler.LambdaLR(engine.optimizer, factor)
        engine.lr_scheduler = scheduler
        engine.checkpoint_manager.lr_scheduler = scheduler

    @register(dispatch_mode=ONE_TO_ALL)
    def export_state_dict(
        self, merged: bool = False
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Weights on CPU (rank 0 only; the other ranks return {}) and the export timing."""
        state, _, metrics = weights.export_state_dict(
            self.engine, keep=self.rank == 0, merged=merged
        )
        return state, metrics

    @register(dispatch_mode=ONE_TO_ALL)
    def save_hf(self, directory: str) -> dict[str, float]:
        _, metrics = weights.save_hf_folder(
            self.engine, self.model_config.tokenizer, Path(directory), self.rank
        )
        return metrics

    @register(dispatch_mode=ONE_TO_ALL)
    def save_lora_adapter(self, directory: str) -> dict[str, float]:
        _, metrics = weights.save_lora_adapter(self.engine, Path(directory), self.rank)
        return metrics
