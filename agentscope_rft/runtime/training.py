"""`TrainingRun`: one training run's components and its two loops, step by named step.

`run()` reads top to bottom: open the components (`_open`), validate before the first step, run
the explorer and trainer loops together until the last step (`_loops`), and, when a health rule
asks for it, roll back to the last healthy checkpoint and run the loops again from there
(`_roll_back`). The explorer and the trainer are two coroutines joined by the buffer; `run.mode`
only sets how far the explorer may run ahead. Training runs in a worker thread, so the gateway
keeps serving episodes while weights update.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from agentscope_rft.buffer.base import BufferTimeout, get_counting_stale
from agentscope_rft.buffer.config import build_buffer
from agentscope_rft.buffer.replay import REUSE_KEY, replay_metrics
from agentscope_rft.config import EXPLORING_MODES, RunConfig
from agentscope_rft.data.selection import TaskSelector
from agentscope_rft.data.side import DataSide
from agentscope_rft.engines.base import Engine, check_engine, engine_metrics
from agentscope_rft.engines.factory import build_engine, read_chat_template
from agentscope_rft.engines.threads import in_own_thread
from agentscope_rft.explorer.diagnosis import RunDiagnosis
from agentscope_rft.explorer.explorer import Explorer, stratum_metrics
from agentscope_rft.explorer.tasks import Task
from agentscope_rft.explorer.trajectory import episode_reward_metrics
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.health.rollback import RollbackState
from agentscope_rft.health.watcher import (
    HealthWatcher,
    health_metrics,
    strongest,
)
from agentscope_rft.monitor import Monitor
from agentscope_rft.monitor.records import logged_at
from agentscope_rft.rss import PhasePeaks, phase_metric
from agentscope_rft.runtime.best import RUN_STATE_FILE, BestCheckpoint, write_json
from agentscope_rft.runtime.components import (
    RolloutLog,
    RunFolderError,
    RunFolderLock,
    checkpoint_dir,
    episode_settings,
    max_tokens_per_call,
    nominal_batch_size,
    prepare_run_dir,
    prune_checkpoints,
    read_state,
    rollback_targets,
    sampling_rules,
    write_state,
)
from agentscope_rft.runtime.deterministic import ordered
from agentscope_rft.runtime.disk import saving_checkpoint
from agentscope_rft.runtime.fork import rewind_step_logs
from agentscope_rft.runtime.gpus import room_for_training
from agentscope_rft.runtime.memory import (
    live_trainer_weights,
    share_trainer_weights,
    sync_weights,
)
from agentscope_rft.runtime.no_samples import why_no_samples
from agentscope_rft.runtime.offline import OfflineBatches, offline_batches
from agentscope_rft.runtime.preflight import Checked
from agentscope_rft.runtime.rollbacks import RollBack, RunRollbacks
from agentscope_rft.runtime.sample_log import SampleLog
from agentscope_rft.runtime.signals import RunStop, RunStopped, Stopping
from agentscope_rft.trainers.base import Trainer
from agentscope_rft.trainers.checkpoint import write_chat_template
from agentscope_rft.trainers.factory import build_trainer
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)

LEAD = {"sync": 0, "one_step_off": 1}
MAX_EMPTY_STEPS = 3


class NoSamplesError(RuntimeError):
    """Several steps in a row left nothing to train; the message says what dropped it."""


class TrainingRun(RunRollbacks):
    """A training run in this process (episodes here, or in runners on a Ray cluster).

    Example:
        >>> last = await TrainingRun(config, Path("runs/x"), False, RunStop(), checked,
        ...                          ray_runtime=None).run()  # doctest: +SKIP
    """

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        resume: bool,
        stop: RunStop,
        checked: Checked,
        *,
        ray_runtime: Any,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        self.stop = stop
        self.checked = checked
        self.ray_runtime = ray_runtime
        self.mode = config.run.mode
        self.steps = config.run.steps
        self.lead = LEAD.get(self.mode, config.run.max_staleness)
        self.stale_limit = 0 if self.mode == "sync" else self.lead
        self.warmup = config.offline.warmup_steps  # (the config allows it in exploring modes only)
        self.mix_demos = config.algorithm.objective == "sft_rl_mix"  # (never in an offline run)
        self.checkpoint_every = config.run.checkpoint_every
        self.engine: Engine | None = None
        self.gateway: Gateway | None = None
        self.explorer: Explorer | None = None
        self.sampler: TaskSelector | None = None
        self.data: DataSide | None = None
        self.start = 0
        self.steps_done = 0
        self.policy_version = 0  # of the weights the engine serves
        self.saved_at: int | None = None
        self.last: dict[str, float] = {}
        self.rollback = RollbackState()
        self.offline: OfflineBatches | None = None
        self.val_tasks, self.val_phase = self._validation_split(checked)
        self.diagnosis = RunDiagnosis(run_dir)  # the first batch of each phase, reported once
        self.peaks = PhasePeaks()  # memory/<phase>_peak_gib in each step's metrics
        self.run_lock: RunFolderLock | None = None

    # ------------------------------------------------------------------ the run, top to bottom
    async def run(self) -> dict[str, float]:
        """Train as configured; returns the last step's metrics (see `runtime.local.train`)."""
        self.peaks.start()
        try:
            await self._open()
        except BaseException:
            self.peaks.stop()
            if self.run_lock is not None:
                self.run_lock.release()
            raise
        try:
            with self.monitor, self.monitor.progress() as progress:
                progress.reset("run", total=self.steps, completed=self.start)
                if self._validation_due():
                    await _until_stopped(self.stop.until(self._evaluate(self.start)))
                while not self.stop.requested:
                    try:
                        await self._loops(progress)
                        break
                    except RollBack as rollback:
                        await self._roll_back(rollback.event, progress)
                if self.stop.requested and self.saved_at != self.steps_done:
                    # what was trained so far, and where to resume
                    self._commit(await self._save_checkpoint(self.steps_done))
        finally:
            await self._close()
        if self.stop.requested and self.steps_done < self.steps:
            reason = self.stop.reason or "request"
            advice = (
                "look at health.jsonl before resuming: the rule will fire again unless the "
                "config changes (--set ...)"
                if reason.startswith("health")
                else "checkpoint saved"
            )
            raise RunStopped(
                reason,
                f"stopped on {reason} after step {self.steps_done} of {self.steps} ({advice}); "
                f"continue with `agentscope-rft train --resume {self.run_dir}`",
            )
        return self.last

    # ------------------------------------------------------------------ opening and closing
    async def _open(self) -> None:
        config, run_dir = self.config, self.run_dir
        self.run_lock = prepare_run_dir(config, run_dir, resume=self.resume)
        self.trainer: Trainer = await in_own_thread(
            build_trainer,
            config.trainer,
            self.checked.model_path,
            config.algorithm,
            total_steps=self.steps,
            seed=config.run.seed,
            batch_size=nominal_batch_size(config),
        )
        self.buffer = build_buffer(config.buffer, run_dir)
        state: dict[str, Any] = {}
        if self.resume:
            state = read_state(run_dir)
            self.start = int(state["step"])
            await self._load_resumed(checkpoint_dir(run_dir, self.start))
            self.rollback = RollbackState.from_dict(state.get("health", {}))
            await self._apply_rollback_changes()
            logger.info("resuming %s after step %d", run_dir, self.start)
            metrics_file = run_dir / "metrics.jsonl"
            if self.start and not (metrics_file.is_file() and metrics_file.stat().st_size):
                logger.warning(
                    "resume: %s is missing or empty: steps 0-%d have no metrics (curves, best "
                    "checkpoint and health rules start at step %d); the weights are the "
                    "checkpoint's",
                    metrics_file,
                    self.start - 1,
                    self.start,
                )
            # The records of steps the crash cut off: those steps are explored again.
            rewind_step_logs(run_dir, self.start)
            # Groups taken by the steps lost in the crash (`start` and later) go back.
            await self.buffer.requeue_after(self.start - 1)
            if self.mode != "train_only":  # explorers re-explore them from the saved position
                await self.buffer.discard_pending()
        self.steps_done = self.policy_version = self.start
        self.saved_at = self.start if self.resume else None
        # Demonstrations are read (and a bad file refused) before the engine loads.
        if config.uses_offline_data():
            self.offline = offline_batches(
                config, self.start, self.checked.offline_units, saved=state
            )
        if self.mode in EXPLORING_MODES:
            await self._open_exploring(state)
        self.rollout_log = RolloutLog(run_dir / "rollouts.jsonl", resume=self.resume)
        self.sample_log = SampleLog(
            run_dir, config.algorithm, limit=config.monitor.sample_log, resume=self.resume
        )
        self.monitor = Monitor(
            run_dir,
            config.monitor,
            run_name=config.run.name or run_dir.name,
            resolved_config=config.model_dump(mode="json"),
            resume=self.resume,
        )
        self.health = HealthWatcher(
            config.health,
            run_dir,
            # the RL steps: after a warm start; none in an offline (SFT or DPO) run
            policy_from=config.run.steps if self.mode == "offline" else config.offline.warmup_steps,
            # the steps logged so far, and the events of those that stand
            resumed=(self.start, self.rollback.rollbacks) if self.resume else None,
            marked=state.get("unhealthy_steps", []),
        )
        self.best = BestCheckpoint(run_dir, config.run.best_metric, config.run.best_mode)
        if config.health.rolls_back():
            self._prepare_rollbacks()

    async def _load_resumed(self, folder: Path) -> None:
        """Load the checkpoint a resume starts from; a damaged file (a disk that filled up, a
        copy cut short) is named, not a deserializer's traceback."""
        import pickle

        import torch
        from safetensors import SafetensorError

        unreadable = (OSError, RuntimeError, EOFError, KeyError, pickle.UnpicklingError)
        try:
            await in_own_thread(self.trainer.load, folder)
        except torch.OutOfMemoryError:
            raise
        except (*unreadable, SafetensorError, ValueError) as exc:
            raise RunFolderError(
                f"cannot resume from {folder}: {str(exc).rstrip('.')}. A damaged checkpoint (a "
                "full disk, a copy cut short) cannot be resumed: continue from an older one with "
                "`agentscope-rft "
                f"train --config {self.run_dir / 'config.yaml'} --set run.dir=<new folder> "
                f"--fork-from {self.run_dir} --fork-step <step>`; one written for another model "
                "needs the run's own model.name_or_path and trainer.lora"
            ) from exc

    async def _open_exploring(self, state: dict[str, Any]) -> None:
        from agentscope_rft.runtime.local import episode_runner

        config = self.config
        engine = build_engine(config.model, config.engine, self.run_dir / "logs", config.gpus)
        if self.ray_runtime is not None:
            self.ray_runtime.host_engine(engine)  # vLLM replicas under actors on the cluster
        await engine.start()
        self.engine = engine
        await share_trainer_weights(config, engine, self.trainer)  # one copy less, where it can
        if self.start:
            await sync_weights(engine, self.trainer, version=self.start)
        gateway = Gateway(
            engine,
            host=config.gateway.host,
            port=config.gateway.port,
            api_key=None if config.gateway.api_key == "auto" else config.gateway.api_key,
            generate_api_key=config.gateway.api_key == "auto",
            sampling_overrides=sampling_rules(config),
            seed_base=config.explorer.seed,
            max_tokens_limit=max_tokens_per_call(config, engine.max_model_len),
            runtime_state=config.gateway.runtime_state,
        )
        await gateway.start()
        self.gateway = gateway
        self.data = DataSide.build(
            config.data,
            self.checked.train_tasks,
            self.run_dir,
            shuffle=config.tasks.shuffle,
            seed=config.run.seed,
            policy_url=gateway.base_url,
            policy_model=engine.model_name,
            policy_key=gateway.api_key,
        )
        self.sampler = self.data.selector
        if "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        assert self.checked.workflow is not None  # exploring modes have one (preflight)
        settings = episode_settings(config, engine.max_model_len)
        runner = await episode_runner(
            config, settings, self.ray_runtime, gateway, engine, self.run_dir
        )
        self.explorer = Explorer(self.checked.workflow, gateway, settings, runner=runner)

    async def _close(self) -> None:
        if self.explorer is not None:
            await self.explorer.close()
        if self.data is not None:
            await self.data.close()
        if self.gateway is not None:
            await self.gateway.stop()
        if self.engine is not None:
            await self.engine.close()
        await self.buffer.close()
        self.trainer.close()
        self.peaks.stop()
        if self.run_lock is not None:
            self.run_lock.release()

    @staticmethod
    def _validation_split(checked: Checked) -> tuple[list[Task], str]:
        """The tasks in-training evaluation runs on: `tasks.val`, else the test split for
        monitoring only (phase `eval`; preflight said so)."""
        if checked.val_tasks:
            return checked.val_tasks, "val"
        return checked.eval_tasks, "eval"

    # ------------------------------------------------------------------ the loops
    async def _loops(self, progress: Any) -> None:
        """The explorer and trainer loops from `self.start` until the last step (or a stop)."""
        self.produced: asyncio.Queue[tuple[int, int, dict[str, float]]] = asyncio.Queue()
        self.sampler_states: dict[int, dict[str, Any]] = {}  # task position before each step
        self.trained = asyncio.Condition()  # notified after every trainer step (skipped too)
        if self.config.health.rolls_back() and self.start == 0 and self.saved_at is None:
            # The starting weights are the first healthy checkpoint.
            self._commit(await self._save_checkpoint(0))
        jobs = [_until_stopped(self._train_loop(progress))]
        if self.explorer is not None:
            jobs.append(_until_stopped(self._explore_loop(progress)))
        await _run_together(jobs)

    async def _explore_loop(self, progress: Any) -> None:
        from agentscope_rft.runtime.local import explore_step

        explorer, sampler, engine, data = self.explorer, self.sampler, self.engine, self.data
        assert explorer is not None and sampler is not None and engine is not None
        assert data is not None
        for step in range(max(self.start, self.warmup), self.steps):
            # After the warm-up, the first batches come from the warmed-up policy.
            await self.stop.until(self._trainer_reached(max(step - self.lead, self.warmup)))
            self.sampler_states[step] = sampler.state_dict()
            # A stop cancels the batch: its episodes' rollouts close, their calls are aborted.
            result, groups, step_metrics = await self.stop.until(
                explore_step(explorer, sampler, self.config, step, progress)
            )
            self.rollout_log.write(step, "train", result)
            self.sample_log.write(step, result)
            check_engine(engine)  # episodes failing for good would only say so 3 steps later
            # the selector hears the rewards; operators filter and rescore before the buffer
            groups, data_metrics = await data.after_explore(step, result.rollouts, groups)
            for group in groups:
                await self.buffer.put(group)
            metrics = result.metrics() | step_metrics | data_metrics | engine_metrics(engine)
            metrics |= self.diagnosis.first(step, "train", result.rollouts)
            await self.produced.put((step, len(groups), metrics))

    async def _train_loop(self, progress: Any) -> None:
        empty_in_a_row = 0
        for step in range(self.start, self.steps):
            if self.stop.requested:
                return
            step_started = time.perf_counter()
            batch = await self._next_batch(step)
            if batch is None:
                return
            samples, metrics = batch
            if samples is None:  # the step explored no samples
                empty_in_a_row += 1
                self._skip_empty_step(step, metrics, empty_in_a_row)
                await self._finish_step(step + 1)
                continue
            empty_in_a_row = 0
            await self._train_step(step, samples, metrics, progress, step_started)

    async def _next_batch(self, step: int) -> tuple[list[Sample] | None, dict[str, float]] | None:
        """The step's samples (None: its episodes produced none) and its explore metrics."""
        metrics: dict[str, float] = {}
        if self.offline is not None and (self.mode == "offline" or step < self.warmup):
            return next(self.offline), metrics  # an offline run, or a warm-up step (objective sft)
        if self.mode == "train_only":
            num_groups = self.config.explorer.tasks_per_step
        else:
            _, num_groups, metrics = await self.stop.until(self.produced.get())
        if num_groups == 0:
            return None, metrics
        oldest = max(0, self.policy_version - self.stale_limit)
        try:
            samples, dropped = await self.stop.until(
                get_counting_stale(
                    self.buffer,
                    num_groups,
                    step=step,
                    min_policy_version=oldest,
                    timeout=self.config.run.get_timeout,
                )
            )
        except BufferTimeout as exc:
            if oldest == 0:
                raise
            raise BufferTimeout(
                f"{exc} (step {step} trains groups of policy versions >= {oldest}: at most "
                f"run.max_staleness={self.stale_limit} behind the trainer's {self.policy_version};"
                " an explorer serving older weights needs a larger run.max_staleness)"
            ) from exc
        if self.mode == "train_only":  # the explorer's metrics stayed in its own process
            metrics.update(
                episode_reward_metrics([s for s in samples if REUSE_KEY not in s.metrics])
            )
        metrics.update(replay_metrics(samples) | dropped)
        if self.mix_demos and self.offline is not None:  # CHORD: demonstrations beside rollouts
            samples = [*samples, *next(self.offline)]
        if self.config.run.deterministic:
            samples = ordered(samples)  # not in the order episodes finished
        return samples, metrics

    def _skip_empty_step(self, step: int, metrics: dict[str, float], in_a_row: int) -> None:
        cause = why_no_samples(metrics, self.run_dir / "rollouts.jsonl")
        logger.warning("step %d: no samples (%s); nothing to train", step, cause)
        self.last = {**metrics, "train/skipped": 1.0}
        self.monitor.log(step, self.last)
        if in_a_row >= MAX_EMPTY_STEPS:
            raise NoSamplesError(
                f"{MAX_EMPTY_STEPS} steps in a row produced no training samples ({cause})"
            )

    async def _train_step(
        self,
        step: int,
        samples: list[Sample],
        metrics: dict[str, float],
        progress: Any,
        started: float,
    ) -> None:
        """Train on the step's samples, sync the weights, watch the run's health, checkpoint,
        log, and validate when due."""
        progress.reset("train", total=1)  # a step once begun finishes, even on a stop
        self._peak(metrics, "explore")  # (in a sync run: exploring the step's groups)
        with self._trainer_working():
            metrics.update(await self._trainer_step(samples, step))
        self._peak(metrics, "train")
        progress.advance("train")
        done = step + 1
        if self.engine is not None and not self.stop.requested:
            with self._trainer_working():
                metrics["time/sync"] = await sync_weights(self.engine, self.trainer, version=done)
            self._peak(metrics, "sync")
        self.policy_version = done
        metrics["time/step"] = time.perf_counter() - started
        events = self.health.observe(step, metrics)
        metrics.update(health_metrics(events))
        action = strongest(events)
        for event in events:
            if event is not action or action.action != "rollback":
                self.health.record(event)  # (a rollback's own event names where it went)
        if action is not None and action.action == "rollback":
            refusal = self._rollback_refusal(action)
            if refusal is None:
                self._log_step(step, metrics)
                raise RollBack(action)
            self.health.record(action)
            logger.error("health: %s; stopping the run", refusal)
            self.stop.request(f"health: {action.rule} ({refusal})")
        if action is not None and action.action == "stop":
            self.stop.request(f"health: {action.rule}")
        saved: dict[str, Any] | None = None
        if (
            done == self.steps
            or self.stop.requested
            or (self.checkpoint_every and done % self.checkpoint_every == 0)
        ):
            saving = time.perf_counter()
            with self._trainer_working():  # before the explorer moves on (sync mode)
                saved = await self._save_checkpoint(done)
            metrics["time/checkpoint"] = time.perf_counter() - saving
            self._peak(metrics, "checkpoint")
        await self._finish_step(done)
        self._log_step(step, metrics)
        if saved is not None:
            # state.json names the checkpoint only once its step is logged: a run killed in
            # between resumes from the one before and redoes this step (superseding its line).
            self._commit(saved)
        progress.advance("run")
        eval_every = self.config.run.eval_every
        if eval_every and (done % eval_every == 0 or done == self.steps):
            await self.stop.until(self._evaluate(done))

    def _trainer_working(self) -> contextlib.AbstractContextManager[None]:
        """The explorer's event-loop monitor paused: the trainer's work in this process (its
        thread) competes with the episodes for the GIL, which is not the app blocking the loop."""
        if self.explorer is None:
            return contextlib.nullcontext()
        return self.explorer.loop_monitor.paused()

    async def _trainer_step(self, samples: list[Sample], step: int) -> dict[str, float]:
        """`trainer.step`; a non-finite gradient is a health event when the rule watches it."""
        try:
            # caches (and an engine's own weight copy) freed / vLLM asleep
            weights = live_trainer_weights(self.config, self.trainer)
            async with room_for_training(self.engine, self.config, weights):
                return await in_own_thread(self.trainer.step, samples, step)
        except FloatingPointError as exc:
            health = self.config.health
            if health.rules.non_finite.action == "off" or not health.enabled:
                raise
            logger.warning("step %d: %s; the update was not applied", step, exc)
            return {"train/non_finite": 1.0, "train/skipped": 1.0}

    def _peak(self, metrics: dict[str, float], phase: str) -> None:
        """Record the process's peak RSS since the previous phase ended as `phase`'s."""
        peak = self.peaks.take()
        if peak is not None:
            metrics[phase_metric(phase)] = round(peak, 3)

    def _log_step(self, step: int, metrics: dict[str, float]) -> None:
        metrics["policy_version"] = float(step + 1)
        rss = self.peaks.now()
        if rss is not None:
            metrics["memory/rss_gib"] = round(rss, 3)
        self.last = metrics
        self.monitor.log(step, metrics)

    async def _trainer_reached(self, step: int) -> None:
        async with self.trained:
            while self.steps_done < step:
                await self.trained.wait()

    async def _finish_step(self, done: int) -> None:
        async with self.trained:
            self.steps_done = done
            self.trained.notify_all()

    # ------------------------------------------------------------------ validation
    def _validation_due(self) -> bool:
        """Validate before the first step; and on resume when the checkpoint resumed from is a
        validation step whose validation was never logged (the run stopped while validating)."""
        every = self.config.run.eval_every
        if not every or not self.val_tasks:
            return False
        if self.start == 0:
            return True
        if self.start % every and self.start != self.steps:
            return False
        return not logged_at(self.run_dir, self.start, self.val_phase)

    async def _evaluate(self, step: int) -> None:
        """Explore the validation tasks greedily with the policy of `step`; keep the best."""
        if self.explorer is None or not self.val_tasks or not self.config.run.eval_every:
            return
        phase = self.val_phase
        self.peaks.take()  # (what ran before belongs to the step just logged)
        result = await self.explorer.explore(
            self.val_tasks,
            group_size=self.config.explorer.eval_group_size,
            batch_id=f"eval{step}" if phase == "eval" else f"eval{step}-val",
        )
        self.rollout_log.write(step, phase, result)
        metrics = {k: v for k, v in result.metrics().items() if not k.startswith("trajectory/")}
        if self.config.tasks.stratify_field:
            metrics |= stratum_metrics(result.rollouts, self.config.tasks.stratify_field)
        metrics |= self.diagnosis.first(step, phase, result.rollouts)
        self._peak(metrics, "eval")
        self.monitor.log(step, metrics, phase=phase)
        if phase == "val":
            await in_own_thread(self.best.consider, step, metrics, self._export_hf)

    # ------------------------------------------------------------------ checkpoints
    def _export_hf(self, target: Path) -> None:
        """The policy as an HF model folder, with the chat template it was trained with."""
        self.trainer.export_hf(target)
        template = read_chat_template(self.config.model.chat_template)
        if template is not None:
            write_chat_template(target, template)

    async def _save_checkpoint(self, done: int) -> dict[str, Any]:
        """Save the weights and optimizer of step `done`; returns the run state to commit."""
        self.saved_at = done
        target = checkpoint_dir(self.run_dir, done)
        # run_state.json marks a whole checkpoint: a step saved again (redone after a resume)
        # drops the one of the earlier attempt first, so a kill while saving leaves no mark
        (target / RUN_STATE_FILE).unlink(missing_ok=True)
        with saving_checkpoint(self.run_dir, target, self.config.run.keep_checkpoints):
            await in_own_thread(self.trainer.save, target)
            await in_own_thread(self._export_hf, target / "model")
            saved: dict[str, Any] = {"step": done, "health": self.rollback.to_dict()}
            saved["unhealthy_steps"] = self.health.marks()  # (streaks not fired yet: no event)
            if self.offline is not None:  # resume trains on from the first unit not yet trained
                saved |= self.offline.state()
            if self.sampler is not None:  # resume re-explores from the first batch not yet trained
                saved["sampler"] = self.sampler_states.get(done, self.sampler.state_dict())
            write_json(target / RUN_STATE_FILE, saved)  # whole or absent, even if killed
        return saved

    def _commit(self, saved: dict[str, Any]) -> None:
        write_state(self.run_dir, saved)
        # what a resume starts from (a newer step folder, left by a kill, may outnumber it)
        keep = {int(saved["step"])}
        if self.config.health.rolls_back():  # what a rollback would return to
            restored, healthy = self.rollback.restored, self.health.healthy
            keep |= rollback_targets(self.run_dir, self.steps_done + 1, restored, healthy)
        prune_checkpoints(self.run_dir, self.config.run.keep_checkpoints, protect=keep)


async def _until_stopped(job: Any) -> None:
    """Run one of the loops; a stop request ends it quietly (the run then saves and exits)."""
    with contextlib.suppress(Stopping):
        await job


async def _run_together(jobs: list[Any]) -> None:
    """Run coroutines until all finish; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
        if pending:
            await asyncio.gather(*pending)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
