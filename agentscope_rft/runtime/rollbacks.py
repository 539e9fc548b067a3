"""Health rollbacks of a training run: going back to the newest healthy checkpoint when a rule
asks for it (weights, optimizer, task position, buffer, logs) with `health.rollback`'s changes.

`RunRollbacks` is the part of `TrainingRun` (its base class) that does it; the training loop
raises `RollBack` out of its loops and `TrainingRun.run` calls `_roll_back`.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentscope_rft.buffer.base import Buffer
from agentscope_rft.config import RunConfig
from agentscope_rft.data.selection import TaskSelector
from agentscope_rft.engines.base import Engine
from agentscope_rft.engines.threads import in_own_thread
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.health.rollback import RollbackState
from agentscope_rft.health.watcher import HealthEvent, HealthWatcher
from agentscope_rft.monitor import Monitor
from agentscope_rft.runtime.best import RUN_STATE_FILE, BestCheckpoint, kept_curve
from agentscope_rft.runtime.components import (
    checkpoint_dir,
    drop_checkpoints_after,
    healthy_checkpoint,
    write_state,
)
from agentscope_rft.runtime.gpus import room_for_training
from agentscope_rft.runtime.memory import live_trainer_weights, sync_weights
from agentscope_rft.runtime.offline import OfflineBatches, offline_batches
from agentscope_rft.runtime.preflight import Checked
from agentscope_rft.trainers.base import Trainer

logger = logging.getLogger(__name__)


class RollBack(Exception):
    """A health rule asks to roll back (raised out of the loops, handled by `run`)."""

    def __init__(self, event: HealthEvent) -> None:
        super().__init__(event.message)
        self.event = event


class RunRollbacks:
    """The rollback steps of `TrainingRun`, which sets every attribute declared here."""

    config: RunConfig
    checked: Checked
    run_dir: Path
    mode: str
    steps: int
    checkpoint_every: int
    trainer: Trainer
    buffer: Buffer
    engine: Engine | None
    gateway: Gateway | None
    sampler: TaskSelector | None
    offline: OfflineBatches | None
    health: HealthWatcher
    monitor: Monitor
    best: BestCheckpoint
    rollback: RollbackState
    start: int
    steps_done: int
    policy_version: int
    saved_at: int | None

    def _prepare_rollbacks(self) -> None:
        """A run that may roll back keeps checkpoints to roll back to (the starting weights too)."""
        if not self.checkpoint_every:
            self.checkpoint_every = max(1, self.steps // 10)
            logger.info(
                "health rules roll back but run.checkpoint_every is 0: checkpointing every %d "
                "steps",
                self.checkpoint_every,
            )

    def _rollback_refusal(self, event: HealthEvent) -> str | None:
        """Why the run cannot roll back for `event` (then it stops), or None."""
        if self.rollback.rollbacks >= self.config.health.rollback.max_rollbacks:
            return (
                f"{event.rule} fired after {self.rollback.rollbacks} rollback(s), the most "
                "health.rollback.max_rollbacks allows"
            )
        if self._healthy_checkpoint(event.onset) is None:
            return (
                f"no healthy checkpoint before step {event.onset} is left to roll back to "
                "(raise run.keep_checkpoints or lower run.checkpoint_every)"
            )
        return None

    def _healthy_checkpoint(self, before: int) -> int | None:
        return healthy_checkpoint(self.run_dir, before, self.health.healthy)

    async def _roll_back(self, event: HealthEvent, progress: Any) -> None:
        """Restore the last healthy checkpoint before `event`'s onset (weights, optimizer, task
        position, buffer) and apply `health.rollback`'s changes; or stop, saying why."""
        settings = self.config.health.rollback
        target = self._healthy_checkpoint(event.onset)
        assert target is not None  # (`_rollback_refusal` said there is one)
        self.health.record(replace(event, rolled_back_to=target))
        folder = checkpoint_dir(self.run_dir, target)
        saved = json.loads((folder / RUN_STATE_FILE).read_text())
        # (the engine may share these weights, or free its own copy meanwhile)
        weights = live_trainer_weights(self.config, self.trainer)
        async with room_for_training(self.engine, self.config, weights):
            await in_own_thread(self.trainer.load, folder)
        self.rollback = self.rollback.after(settings, target)
        await self._apply_rollback_changes()
        if self.mode == "train_only":  # the groups trained since go back (a durable buffer)
            await self.buffer.requeue_after(target - 1)
        else:  # what was explored since is re-explored from the restored task position, and
            # the abandoned steps' groups are never replayed
            await self.buffer.abandon_after(target - 1)
            await self.buffer.discard_pending()
        if self.sampler is not None and "sampler" in saved:
            self.sampler.load_state_dict(saved["sampler"])
        if self.engine is not None:
            await sync_weights(self.engine, self.trainer, version=target)
        if self.gateway is not None:  # the redone steps sample as a run resumed here would
            self.gateway.restart_call_numbers()
        if self.config.uses_offline_data():
            self.offline = offline_batches(
                self.config, target, self.checked.offline_units, saved=saved
            )
        self.health.rewind(target, self.rollback.rollbacks)
        self.monitor.supersede_from(target)
        await in_own_thread(self._rewind_best, target)
        self.start = self.steps_done = self.policy_version = target
        self.saved_at = target
        rewound = {"health": self.rollback.to_dict(), "unhealthy_steps": self.health.marks()}
        write_state(self.run_dir, {**saved, **rewound})
        drop_checkpoints_after(self.run_dir, target)  # (after: a resume may need them)
        progress.reset("run", total=self.steps, completed=target)
        logger.warning(
            "health: rolled back to step %d (rollback %d of %d): %s",
            target,
            self.rollback.rollbacks,
            settings.max_rollbacks,
            self.rollback.describe(),
        )

    def _rewind_best(self, target: int) -> None:
        """A best checkpoint chosen after `target` was abandoned with its steps: the best kept
        validation up to `target` takes its place (its policy: the restored one, or a kept
        checkpoint's)."""
        restored = self.run_dir / "checkpoints" / "best.restored"
        shutil.rmtree(restored, ignore_errors=True)

        def policy(step: int) -> Path | None:
            if step == target:
                if not restored.is_dir():
                    self.trainer.export_hf(restored)
                return restored
            model = checkpoint_dir(self.run_dir, step) / "model"
            return model if (model / "config.json").is_file() else None

        try:
            self.best.rewind(target, kept_curve(self.run_dir, self.best.names), policy)
        finally:
            shutil.rmtree(restored, ignore_errors=True)

    async def _apply_rollback_changes(self) -> None:
        if self.rollback.rollbacks == 0:
            return
        algorithm = self.rollback.algorithm(self.config.algorithm)
        await in_own_thread(self.trainer.adjust, self.rollback.lr_scale, algorithm)
