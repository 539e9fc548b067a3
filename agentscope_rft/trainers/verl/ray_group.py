"""The verl trainer as a Ray worker group: separate GPUs and multi-node placements.

The driver (our trainer, in the run's main process or a Ray actor) holds a verl `RayWorkerGroup`
of `AgentscopeTrainingWorker` actors placed by a `RayResourcePool` (`devices_per_node` x
`num_nodes` bundles), exactly as verl's own Ray SFT trainer does. `train_step` sends the whole
batch; verl's `make_nd_compute_dataproto_dispatch_fn` splits it across data-parallel ranks and
collects rank 0's metrics.

On CPU (tests) the actors get `VERL_PLATFORM=cpu` and the CPU plugin module in
`VERL_USE_EXTERNAL_MODULES`, so `import verl` in the actor selects the CPU platform first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import torch
from tensordict import TensorDict

from agentscope_rft.trainers.verl.convert import num_trained_sequences
from agentscope_rft.trainers.verl.engine import (
    VerlEngineSettings,
    engine_batch,
    prepare_verl,
    reduce_metrics,
    reference_config,
    step_meta,
    worker_config,
)
from agentscope_rft.trainers.verl.loss import EngineLoss

CPU_WORKER_ENV = {
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": "agentscope_rft.trainers.verl.cpu_plugin",
}


class RayTrainingGroup:
    """`devices_per_node` x `num_nodes` verl training ranks as Ray actors (Ray must be running).

    Example:
        >>> group = RayTrainingGroup(settings, loss, devices_per_node=4)  # doctest: +SKIP
        >>> group.train_step(batch)["loss"]  # doctest: +SKIP
    """

    def __init__(
        self,
        settings: VerlEngineSettings,
        loss: EngineLoss,
        *,
        devices_per_node: int,
        num_nodes: int = 1,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        prepare_verl(settings.device)
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        from agentscope_rft.trainers.verl.worker import AgentscopeTrainingWorker

        self.settings = settings
        on_cpu = settings.device == "cpu"
        env = {**(CPU_WORKER_ENV if on_cpu else {}), **(worker_env or {})}
        pool = RayResourcePool(
            process_on_nodes=[devices_per_node] * num_nodes,
            use_gpu=not on_cpu,
            # one rank per GPU; on CPU one rank per bundle of 1 CPU
            max_colocate_count=1,
        )
        actor = RayClassWithInitArgs(
            ray.remote(AgentscopeTrainingWorker),
            config=worker_config(settings),
            device=settings.device,
        )
        started = time.perf_counter()
        # verl binds the worker's registered methods onto the group at run time.
        self.group = cast(
            Any,
            RayWorkerGroup(
                resource_pool=pool,
                ray_cls_with_init=actor,
                device_name=settings.device,
                worker_env=env,
            ),
        )
        self.group.set_loss_fn(loss)
        self.group.reset()
        if settings.reference and settings.lora_rank == 0:
            self.group.build_reference(reference_config(settings))
        self.build_s = time.perf_counter() - started
        self.world_size = devices_per_node * num_nodes
        self.pad_token_id = _pad_token_id(settings.model_path)
        self.sync_metrics: dict[str, float] = {}
        self.steps = 0

    @property
    def batch_multiple(self) -> int:
        if self.settings.max_tokens_per_micro_batch is not None:
            return self.world_size
        return self.world_size * self.settings.micro_batch_size

    def train_step(self, batch: TensorDict, **meta: Any) -> dict[str, float]:
        """One optimizer step on a padded batch (rows: a multiple of `batch_multiple`); `meta` is
        attached to the batch for verl's engine and the loss function."""
        from verl.utils import tensordict_utils as tu

        data = engine_batch(
            batch, self.pad_token_id, update_lr_scheduler=True, **step_meta(batch), **meta
        )
        started = time.perf_counter()
        output = _result(self.group.train_batch(data))
        self.steps += 1
        metrics = reduce_metrics(tu.get(output, "metrics"))
        metrics.update(
            step_time_s=time.perf_counter() - started,
            num_tokens=float(batch["response_mask"].sum()),
            num_sequences=float(num_trained_sequences(batch)),
        )
        return metrics

    def compute_logprobs(
        self, batch: TensorDict, *, reference: bool = False, **meta: Any
    ) -> torch.Tensor:
        """Log-probs of every response token, [B, R]: the policy's or the reference's."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        data = engine_batch(
            batch,
            self.pad_token_id,
            compute_loss=False,
            calculate_entropy=False,
            **step_meta(batch),
            **meta,
        )
        infer = self.group.infer_reference if reference else self.group.infer_batch
        output = _result(infer(data))
        return no_padding_2_padding(tu.get(output, "log_probs"), data).float().cpu()

    def set_lr_schedule(self, factor: Any) -> None:
        self.group.set_lr_schedule(factor)

    def state_dict_for_sync(self, *, merged: bool = False) -> dict[str, torch.Tensor]:
        """Weights gathered by rank 0 (the other ranks only take part in the gathers)."""
        results = self.group.export_state_dict(merged=merged)
        state, self.sync_metrics = results[0]
        return state

    def save_hf(self, directory: str | Path) -> Path:
        self.sync_metrics = self.group.save_hf(str(directory))[0]
        return Path(directory)

    def save_lora_adapter(self, directory: str | Path) -> Path:
        self.sync_metrics = self.group.save_lora_adapter(str(directory))[0]
        return Path(directory)

    def save(self, directory: str | Path) -> None:
        """verl's sharded checkpoint; every rank writes its shard (a shared filesystem across
        nodes)."""
        self.group.save_checkpoint(str(directory), global_step=self.steps)

    def load(self, directory: str | Path) -> None:
        self.group.load_checkpoint(str(directory))

    def close(self) -> None:
        """Stop the worker actors."""
        import ray

        for worker in getattr(self.group, "workers", []):
            ray.kill(worker)


def _result(output: Any) -> Any:
    """verl's non-blocking group calls return a future (`.get()`); blocking ones the value."""
    if isinstance(output, TensorDict) or not hasattr(output, "get"):
        return output
    return output.get()


def _pad_token_id(model_path: str) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)
