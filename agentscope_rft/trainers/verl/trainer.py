"""`VerlTrainer`: the trainer protocol on verl's FSDP training engine.

The algorithm runs on our side, exactly as in the torch trainer (`trainers/common.py`): drop
zero-variance groups, reference and old log-probs, advantages from the algorithm library, the
mini-batch split, the LR schedule. verl runs what scales: forward, backward and AdamW over FSDP
ranks, with `policy_objective` itself as the loss inside its micro-batch loop (`ObjectiveLoss`),
so both backends compute the same loss from the same inputs.

One rank runs in this process (`VerlTrainingEngine`); more ranks (GPUs, nodes) run as Ray actors
(`RayTrainingGroup`), started from here.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor

from agentscope_rft.algorithms import AlgorithmConfig, loss_normalizers, rollout_seq_weights
from agentscope_rft.config import VerlTrainerConfig
from agentscope_rft.trainers.batch import TrainBatch, build_batch
from agentscope_rft.trainers.checkpoint import save_hf_weights
from agentscope_rft.trainers.common import (
    LogprobGap,
    LRSchedule,
    batch_advantages,
    batch_metrics,
    filter_step_samples,
    mini_batch_rows,
    step_metrics,
    total_optimizer_steps,
)
from agentscope_rft.trainers.verl import convert
from agentscope_rft.trainers.verl.loss import (
    NORM_SEQUENCES_KEY,
    NORM_SFT_TOKENS_KEY,
    NORM_TOKENS_KEY,
    OPTIMIZER_STEP_KEY,
    ObjectiveLoss,
)
from agentscope_rft.trainers.verl.placement import VerlConfigError
from agentscope_rft.trainers.verl.settings import VerlPlan, plan
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)

STATE_FILE = "verl_trainer.pt"
"""Our side of a checkpoint (optimizer-step count, RNG); verl's sharded state is in `verl/`."""


class VerlTrainer:
    """Trains the policy with verl's FSDP engine and this project's algorithms.

    Example:
        >>> trainer = VerlTrainer(path, VerlTrainerConfig(n_gpus_per_node=4, lr=1e-6),
        ...                       AlgorithmConfig(), total_steps=100)  # doctest: +SKIP
        >>> metrics = trainer.step(samples, step=0)  # doctest: +SKIP
        >>> await engine.load_weights(trainer.state_dict_for_sync(), version=1)  # doctest: +SKIP
    """

    def __init__(
        self,
        model_path: str | Path,
        config: VerlTrainerConfig,
        algorithm: AlgorithmConfig,
        *,
        total_steps: int,
        seed: int = 0,
        batch_size: int | None = None,
    ) -> None:
        started = time.perf_counter()
        self.model_path = Path(model_path)
        self.config = config
        self.algorithm = algorithm
        optimizer_steps = total_optimizer_steps(config, total_steps)
        self.plan: VerlPlan = plan(
            config,
            str(model_path),
            algorithm,
            optimizer_steps=optimizer_steps,
            seed=seed,
            batch_size=batch_size,
        )
        torch.manual_seed(seed)
        self._owns_ray = False
        self.backend: Any = self._start_ranks(ObjectiveLoss(algorithm))
        self.schedule = LRSchedule.of(config, optimizer_steps)
        self.backend.set_lr_schedule(self.schedule)
        self.pad_id = int(self.backend.pad_token_id)
        self.optimizer_steps = 0
        self._budget_logged = False
        logger.info(
            "verl trainer: %s ready in %.1fs (%s%s)",
            self.model_path.name,
            time.perf_counter() - started,
            self.plan.layout.sharding,
            f", LoRA rank {config.lora.rank}" if config.lora else "",
        )

    def _start_ranks(self, loss: ObjectiveLoss) -> Any:
        settings = self.plan.settings
        if not self.plan.use_ray:
            from agentscope_rft.trainers.verl.engine import VerlTrainingEngine

            return VerlTrainingEngine(settings, loss)
        import ray

        from agentscope_rft.trainers.verl.ray_group import RayTrainingGroup

        ray_cfg = self.config.ray
        if not ray.is_initialized():
            local = ray_cfg.address is None and "RAY_ADDRESS" not in os.environ
            ray.init(
                address=ray_cfg.address,
                num_cpus=ray_cfg.num_cpus if local else None,
                include_dashboard=False,
                # verl's workers print per-rank progress; it stays in Ray's session logs
                # (/tmp/ray/session_latest/logs); their errors still reach this process.
                log_to_driver=False,
            )
            self._owns_ray = True
            logger.info(
                "verl trainer: %s Ray (%s)",
                "started a local" if local else "joined",
                ray_cfg.address or os.environ.get("RAY_ADDRESS", "this machine"),
            )
        else:  # `runtime: ray` (or the caller) joined a cluster already: the ranks go there
            logger.info(
                "verl trainer: %d rank(s) in the Ray cluster this process is connected to (%s)",
                self.config.world_size,
                ray.get_runtime_context().gcs_address,
            )
        needed = self.config.world_size
        kind = "GPU" if settings.device == "cuda" else "CPU"
        available = ray.cluster_resources().get(kind, 0.0)
        if available < needed:
            self.close()  # a Ray started here stops again
            raise VerlConfigError(
                f"the trainer needs {needed} {kind}s in the Ray cluster ({self.config.nnodes} "
                f"node(s) x n_gpus_per_node {self.config.n_gpus_per_node}) but it has "
                f"{available:g}; lower trainer.n_gpus_per_node / trainer.nnodes or add nodes"
            )
        # Actors import this package by name: a source checkout must be on their path too.
        package_root = str(Path(__file__).resolve().parents[3])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        return RayTrainingGroup(
            settings,
            loss,
            devices_per_node=self.config.n_gpus_per_node,
            num_nodes=self.config.nnodes,
            worker_env={"PYTHONPATH": path},
        )

    # ------------------------------------------------------------------ training step
    def step(self, samples: Sequence[Sample], step: int) -> dict[str, float]:
        """One training step on a batch; the same metrics as the torch trainer."""
        started = time.perf_counter()
        samples, metrics = filter_step_samples(samples, self.algorithm, self.pad_id, step)
        if not samples:
            return {**metrics, "time/train": time.perf_counter() - started}
        batch = build_batch(samples, self.pad_id, self.config.max_seq_len)
        algo = self.algorithm
        ref = self._logprobs(batch, reference=True) if algo.needs_reference() else None
        recompute = self.config.old_logprobs == "recompute"
        old = self._logprobs(batch, reference=False) if recompute else batch.rollout_logprobs
        advantages, _ = batch_advantages(batch, old, ref, None, algo, metrics)
        seq_weights = rollout_seq_weights(batch.episode_ids)

        sums: dict[str, float] = defaultdict(float)
        lr = self.config.lr * self.schedule(self.optimizer_steps)
        gap = LogprobGap.of(batch, version=step)  # engine vs trainer, before the first update
        parts = mini_batch_rows(batch, self.config.mini_batches)
        for epoch in range(self.config.epochs):
            for index, mini in enumerate(parts):
                first = gap if epoch == 0 and index == 0 else None
                lr = self._update(batch, mini, old, ref, advantages, seq_weights, sums, first)
        updates = self.config.epochs * len(parts)
        metrics.update(step_metrics(sums, updates, batch, time.perf_counter() - started))
        metrics.update(batch_metrics(batch, old, ref, recompute, gap))
        metrics["lr"] = lr
        return metrics

    def _update(
        self,
        batch: TrainBatch,
        mini: list[int],
        old: Tensor,
        ref: Tensor | None,
        advantages: Tensor,
        seq_weights: Tensor,
        sums: dict[str, float],
        gap: LogprobGap | None = None,
    ) -> float:
        """One optimizer step over the rows `mini` of `batch`; returns the next step's LR.

        `gap` (the step's first update) collects the engine-vs-trainer log-prob gap."""
        mini = self._trimmed(mini)
        part = batch.select(mini)
        weights = seq_weights[mini] if self.algorithm.normalize_per_rollout else None
        norms = loss_normalizers(part.loss_mask, self.algorithm, weights, part.sample_kinds)
        data = self._verl_batch(
            part,
            advantages[mini],
            old[mini],
            ref[mini] if ref is not None else None,
            seq_weights[mini],
        )
        # the rows whose engine log-probs the loss compares with the trainer's (`LogprobGap`)
        index = data["sample_index"]
        measured = gap.rows[mini] if gap is not None else torch.zeros(len(mini), dtype=torch.bool)
        data["gap_rows"] = (index >= 0) & measured[index.clamp(min=0)]
        out = self.backend.train_step(
            data,
            calculate_entropy=True,
            **{
                NORM_TOKENS_KEY: norms.num_tokens,
                NORM_SEQUENCES_KEY: norms.num_seqs,
                NORM_SFT_TOKENS_KEY: norms.num_sft_tokens,
                OPTIMIZER_STEP_KEY: self.optimizer_steps,
            },
            **self._budget(part),
        )
        self.optimizer_steps += 1
        grad_norm = out.pop("grad_norm")
        if not torch.isfinite(torch.tensor(grad_norm)):
            raise FloatingPointError(f"non-finite gradient norm ({grad_norm}); lower trainer.lr")
        lr = float(out.pop("lr"))
        sums["grad_norm"] += grad_norm
        if "mfu" in out:
            sums["perf/mfu"] += out.pop("mfu")
        for key in ("step_time_s", "num_tokens", "num_sequences"):
            out.pop(key, None)
        for key in ("sum", "tokens"):
            value = out.pop(f"gap/{key}", 0.0)
            if gap is not None:
                setattr(gap, key, getattr(gap, key) + value)
        for key, value in out.items():
            sums[key] += value
        return lr

    def _trimmed(self, rows: list[int]) -> list[int]:
        """`batch_padding: trim`: drop trailing rows so the mini-batch splits evenly."""
        multiple = self.backend.batch_multiple
        excess = len(rows) % multiple
        if self.config.batch_padding != "trim" or not excess or excess == len(rows):
            return rows
        logger.info(
            "verl: mini-batch of %d samples trimmed by %d to %d, a multiple of %d (ranks x "
            "micro-batch size)",
            len(rows),
            excess,
            len(rows) - excess,
            multiple,
        )
        return rows[: len(rows) - excess]

    def _budget(self, part: TrainBatch) -> dict[str, int]:
        """A sample longer than the token budget gets a micro-batch of its own (as in the torch
        trainer): verl's dynamic batching needs the budget to hold the longest sample."""
        budget = self.plan.settings.max_tokens_per_micro_batch
        longest = int(part.lengths.max())
        if budget is None or longest <= budget:
            return {}
        if not self._budget_logged:
            logger.info(
                "verl: a %d-token sample exceeds trainer.micro_batch_tokens %d; raising the "
                "micro-batch budget of such batches to their longest sample",
                longest,
                budget,
            )
            self._budget_logged = True
        return {"max_token_len_per_gpu": longest}

    def _verl_batch(
        self,
        part: TrainBatch,
        advantages: Tensor,
        old: Tensor,
        ref: Tensor | None,
        seq_weights: Tensor,
    ) -> TensorDict:
        """verl's padded batch of `part` with the per-row fields `ObjectiveLoss` reads."""
        data = convert.build_batch(
            part.samples,
            advantages,
            pad_token_id=self.pad_id,
            old_logprobs=old,
            ref_logprobs=ref,
            multiple_of=self.backend.batch_multiple,
        )
        index = data["sample_index"]
        real = index >= 0
        rows = index.clamp(min=0)
        data["temperature"] = torch.where(real, part.temperature[rows], 1.0)
        data["seq_weights"] = torch.where(real, seq_weights[rows], 1.0)
        data["sample_kinds"] = torch.where(real, part.sample_kinds[rows], 0)
        # padding rows pair with nothing: negative ids, which no real pair has
        data["pair_index"] = torch.where(real, part.pair_index[rows], -1 - torch.arange(len(index)))
        data["is_chosen"] = torch.where(real, part.is_chosen[rows], False)
        return data

    def _logprobs(self, batch: TrainBatch, *, reference: bool) -> Tensor:
        """Log-probs [N, T] of the batch (token layout, 0 on untrained positions)."""
        zeros = torch.zeros(batch.input_ids.shape)
        data = self._verl_batch(batch, zeros, zeros, None, torch.ones(len(batch.samples)))
        values = self.backend.compute_logprobs(data, reference=reference, **self._budget(batch))
        out = torch.zeros(batch.input_ids.shape)
        for i, row in enumerate(convert.response_values_to_tokens(values, data)):
            out[i, : len(row)] = torch.tensor(row)
        return out * batch.loss_mask

    # ------------------------------------------------------------------ weights and checkpoints
    def state_dict_for_sync(self) -> dict[str, Tensor]:
        """Full HF-named weights (LoRA merged), gathered by rank 0 (the only copy made)."""
        state = self.backend.state_dict_for_sync(merged=True)
        logger.debug("verl: weights exported: %s", self.backend.sync_metrics)
        return state

    def export_hf(self, target: Path) -> None:
        """An HF model folder (weights, config, tokenizer), written by this process."""
        started = time.perf_counter()
        save_hf_weights(self.state_dict_for_sync(), self.model_path, target)
        logger.info("verl: HF model written to %s in %.1fs", target, time.perf_counter() - started)

    def export_lora_adapter(self, target: Path) -> None:
        """A PEFT adapter folder (LoRA runs), what vLLM's `/v1/load_lora_adapter` reads."""
        if self.config.lora is None:
            raise ValueError("this run trains all weights: there is no LoRA adapter to export")
        self.backend.save_lora_adapter(target)

    def save(self, directory: Path) -> None:
        """verl's sharded checkpoint (weights, AdamW, LR schedule, per-rank RNG) in `verl/`, the
        LoRA adapter in `adapter/`, our step count and RNG in `verl_trainer.pt`."""
        started = time.perf_counter()
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(directory / "verl")
        if self.config.lora is not None:
            self.export_lora_adapter(directory / "adapter")
        state = {"optimizer_steps": self.optimizer_steps, "torch_rng": torch.get_rng_state()}
        torch.save(state, directory / STATE_FILE)
        logger.info("verl: checkpoint %s saved in %.1fs", directory, time.perf_counter() - started)

    def load(self, directory: Path) -> None:
        if not (directory / STATE_FILE).is_file():
            raise ValueError(
                f"{directory} is not a verl trainer checkpoint (no {STATE_FILE}); a run resumes "
                "with the trainer type it was saved with"
            )
        started = time.perf_counter()
        self.backend.load(directory / "verl")
        state = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
        self.optimizer_steps = int(state["optimizer_steps"])
        torch.set_rng_state(state["torch_rng"])
        logger.info("verl: checkpoint %s loaded in %.1fs", directory, time.perf_counter() - started)

    def adjust(self, lr_scale: float, algorithm: AlgorithmConfig) -> None:
        """Only a no-op change: verl's ranks hold their optimizer and loss (the config refuses
        rollback changes with this trainer)."""
        if lr_scale != 1.0 or algorithm != self.algorithm:
            raise NotImplementedError(
                "the verl trainer cannot change its learning rate or algorithm mid-run; set "
                "health.rollback.lr_factor: 1 and leave kl_coef and entropy_coef null"
            )

    def close(self) -> None:
        close = getattr(getattr(self, "backend", None), "close", None)
        if close is not None:
            close()
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False
