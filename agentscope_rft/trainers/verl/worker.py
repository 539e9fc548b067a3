"""verl's `TrainingWorker` plus the weight-export calls our trainer needs, usable in-process or as
a Ray actor of a `RayWorkerGroup`.

The extra methods are registered with verl's own `register(dispatch_mode=...)` decorator, the
extension point of its single-controller workers, so a worker group dispatches them to all ranks.
Import this module only after `engine.prepare_verl(device)` (or, in a worker process, with the CPU
plugin in `VERL_USE_EXTERNAL_MODULES`): it imports verl's engines, which read the platform.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import TrainingWorker

from agentscope_rft.trainers.verl import weights
from agentscope_rft.trainers.verl.engine import Device, init_distributed, prepare_verl

# verl registers its dispatch modes at run time (a DynamicEnum), invisible to type checkers.
ONE_TO_ALL = getattr(Dispatch, "ONE_TO_ALL")  # noqa: B009


class AgentscopeTrainingWorker(TrainingWorker):
    """A verl training worker (no rollout engine) with HF / LoRA / per-tensor weight export."""

    def __init__(self, config: Any, device: Device = "cuda") -> None:
        prepare_verl(device)  # no-op when the in-process engine already did it
        if device == "cpu":
            # verl's own process-group initialiser asks torch for "cpu:gloo,cpu:gloo" on CPU.
            init_distributed("cpu")
        super().__init__(config)

    @register(dispatch_mode=ONE_TO_ALL)
    def export_state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Weights on CPU (every rank) and the export timing."""
        state, _, metrics = weights.export_state_dict(self.engine)
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
