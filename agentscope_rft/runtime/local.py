"""The local runtime: one process, asyncio; engine, gateway, explorer, buffer and trainer together.

`train` is the whole training loop. With `runtime: ray` the loop is the same; only the episodes
run elsewhere (in runner processes on a Ray cluster, see `agentscope_rft.runtime.ray`). The
explorer and the trainer are two coroutines joined by the buffer; `run.mode` only sets how far
the explorer may run ahead of the trainer: 0 batches (`sync`, on-policy), 1 (`one_step_off`) or
`run.max_staleness` (`async`). Training runs in a worker thread, so the gateway keeps serving
episodes while weights update.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from agentscope_rft.buffer.base import group_samples
from agentscope_rft.buffer.config import build_buffer
from agentscope_rft.config import RunConfig
from agentscope_rft.engines.base import Engine, engine_metrics
from agentscope_rft.engines.factory import build_engine
from agentscope_rft.engines.threads import in_own_thread
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer, ExploreResult
from agentscope_rft.explorer.runner import EpisodeRunner, ModelSettings
from agentscope_rft.explorer.tasks import TaskSampler
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.monitor import Monitor
from agentscope_rft.runtime.components import (
    RolloutLog,
    checkpoint_dir,
    episode_settings,
    max_tokens_per_call,
    nominal_batch_size,
    prepare_run_dir,
    prune_checkpoints,
    read_state,
    sampling_rules,
    write_state,
)
from agentscope_rft.runtime.deterministic import deterministic_config, ordered
from agentscope_rft.runtime.memory import release_freed_memory
from agentscope_rft.runtime.offline import offline_batches
from agentscope_rft.runtime.preflight import Checked, preflight
from agentscope_rft.runtime.signals import RunStop, RunStopped, Stopping
from agentscope_rft.trainers.base import Trainer
from agentscope_rft.trainers.common import drop_zero_variance
from agentscope_rft.trainers.factory import build_trainer
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)

LEAD = {"sync": 0, "one_step_off": 1}
MAX_EMPTY_STEPS = 3


async def _sync_weights(engine: Engine, trainer: Trainer, version: int) -> float:
    started = time.perf_counter()
    weights = await in_own_thread(trainer.state_dict_for_sync)
    await engine.load_weights(weights, version)
    del weights
    # The step's activations and the weight copy are free now: give the pages back.
    release_freed_memory()
    return time.perf_counter() - started


async def train(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    stop: RunStop | None = None,
    checked: Checked | None = None,
) -> dict[str, float]:
    """Run training as configured; returns the last step's metrics.

    `stop` (the CLI routes SIGINT/SIGTERM to it) ends the run early but cleanly: exploring stops,
    a step in progress finishes, a checkpoint and the run state are written, then `RunStopped` is
    raised; `resume=True` continues exactly from there. `checked`: the result of `preflight` when
    the caller ran it already (the CLI does, to fail fast before importing the training stack).

    Example:
        >>> asyncio.run(train(load_config("run.yaml"), Path("runs/run")))  # doctest: +SKIP
    """
    stop = stop or RunStop()
    config = deterministic_config(config)  # a no-op unless run.deterministic
    checked = checked or preflight(config)  # everything checkable, before anything loads
    if config.runtime.type == "local":
        return await _train(config, run_dir, resume, stop, checked, ray_runtime=None)
    from agentscope_rft.runtime.ray import RayRuntime

    # Joined (or started) and checked before any work, so the trainer's Ray ranks join it too.
    ray_runtime = await asyncio.to_thread(RayRuntime, config)
    try:
        return await _train(config, run_dir, resume, stop, checked, ray_runtime=ray_runtime)
    finally:
        ray_runtime.close()


async def _episode_runner(
    config: RunConfig,
    settings: EpisodeSettings,
    ray_runtime: Any,
    gateway: Gateway,
    engine: Engine,
    run_dir: Path,
) -> EpisodeRunner | None:
    """The Ray runtime's runner pool, weights routed to its nodes (None: episodes run here)."""
    if ray_runtime is None:
        return None
    model = ModelSettings(engine.model_name, settings.model_stream, settings.max_tokens)
    try:
        await ray_runtime.place_weights(engine, run_dir)
        runner: EpisodeRunner = await ray_runtime.episode_runner(config, model, gateway.port)
    except BaseException:
        await gateway.stop()
        await engine.close()
        raise
    return runner


async def _train(
    config: RunConfig,
    run_dir: Path,
    resume: bool,
    stop: RunStop,
    checked: Checked,
    *,
    ray_runtime: Any,
) -> dict[str, float]:
    prepare_run_dir(config, run_dir, resume=resume)
    mode, steps = config.run.mode, config.run.steps
    trainer = await in_own_thread(
        build_trainer,
        config.trainer,
        checked.model_path,
        config.algorithm,
        total_steps=steps,
        seed=config.run.seed,
        batch_size=nominal_batch_size(config),
    )
    buffer = build_buffer(config.buffer, run_dir)
    start = 0
    state: dict[str, Any] = {}
    if resume:
        state = read_state(run_dir)
        start = int(state["step"])
        await in_own_thread(trainer.load, checkpoint_dir(run_dir, start))
        logger.info("resuming %s after step %d", run_dir, start)
        # Groups taken by the steps lost in the crash (`start` and later) go back to the buffer.
        await buffer.requeue_after(start - 1)
        if mode != "train_only":  # explorers re-explore them from the saved task position
            await buffer.discard_pending()
    # Demonstrations are read (and a bad file refused) before the engine loads.
    offline = offline_batches(config, start) if config.uses_offline_data() else None
    warmup = config.offline.warmup_steps  # (the config allows it in exploring modes only)
    mix_demos = config.algorithm.objective == "sft_rl_mix"  # (never in an offline run)
    if mode in ("offline", "train_only"):
        engine, gateway, explorer, sampler, eval_tasks = None, None, None, None, []
    else:
        engine = build_engine(config.model, config.engine, log_dir=run_dir / "logs")
        if ray_runtime is not None:
            ray_runtime.host_engine(engine)  # vLLM replicas under actors on the cluster's nodes
        await engine.start()
        if start:
            await _sync_weights(engine, trainer, version=start)
        gateway = Gateway(
            engine,
            host=config.gateway.host,
            port=config.gateway.port,
            api_key=None if config.gateway.api_key == "auto" else config.gateway.api_key,
            generate_api_key=config.gateway.api_key == "auto",
            sampling_overrides=sampling_rules(config),
            seed_base=config.explorer.seed,
            max_tokens_limit=max_tokens_per_call(config, engine.max_model_len),
        )
        await gateway.start()
        sampler = TaskSampler(
            checked.train_tasks, shuffle=config.tasks.shuffle, seed=config.run.seed
        )
        if "sampler" in state:
            sampler.load_state_dict(state["sampler"])
        eval_tasks = checked.eval_tasks
        assert checked.workflow is not None  # exploring modes have one (preflight)
        settings = episode_settings(config, engine.max_model_len)
        runner = await _episode_runner(config, settings, ray_runtime, gateway, engine, run_dir)
        explorer = Explorer(checked.workflow, gateway, settings, runner=runner)

    lead = LEAD.get(mode, config.run.max_staleness)
    stale_limit = 0 if mode == "sync" else lead
    produced: asyncio.Queue[tuple[int, int, dict[str, float]]] = asyncio.Queue()
    sampler_states: dict[int, dict[str, int]] = {}  # task position before exploring each step
    trained = asyncio.Condition()  # notified after every trainer step (skipped ones included)
    steps_done = start
    policy_version = start  # of the weights the engine serves
    rollout_log = RolloutLog(run_dir / "rollouts.jsonl", resume=resume)
    last: dict[str, float] = {}
    monitor = Monitor(
        run_dir,
        config.monitor,
        run_name=config.run.name or run_dir.name,
        resolved_config=config.model_dump(mode="json"),
        resume=resume,
    )

    async def evaluate(step: int) -> None:
        if explorer is None or not eval_tasks or not config.run.eval_every:
            return
        result = await explorer.explore(
            eval_tasks, group_size=config.explorer.eval_group_size, batch_id=f"eval{step}"
        )
        rollout_log.write(step, "eval", result)
        monitor.log(
            step,
            {k: v for k, v in result.metrics().items() if not k.startswith("trajectory/")},
            phase="eval",
        )

    async def trainer_reached(step: int) -> None:
        async with trained:
            while steps_done < step:
                await trained.wait()

    async def explore_loop(progress: Any) -> None:
        assert explorer is not None and sampler is not None and engine is not None
        for step in range(max(start, warmup), steps):
            # After the warm-up, the first batches come from the warmed-up policy.
            await stop.until(trainer_reached(max(step - lead, warmup)))
            sampler_states[step] = sampler.state_dict()
            # A stop cancels the batch: its episodes' rollouts close, their calls are aborted.
            result, groups, step_metrics = await stop.until(
                explore_step(explorer, sampler, config, step, progress)
            )
            rollout_log.write(step, "train", result)
            for group in groups:
                await buffer.put(group)
            metrics = result.metrics() | step_metrics | engine_metrics(engine)
            await produced.put((step, len(groups), metrics))

    async def finish_step(done: int) -> None:
        nonlocal steps_done
        async with trained:
            steps_done = done
            trained.notify_all()

    async def train_loop(progress: Any) -> None:
        nonlocal last, policy_version
        empty_in_a_row = 0
        for step in range(start, steps):
            if stop.requested:
                return
            step_started = time.perf_counter()
            metrics: dict[str, float] = {}
            if offline is not None and (mode == "offline" or step < warmup):
                samples = next(offline)  # an offline run, or a warm-up step (objective sft)
            else:
                if mode == "train_only":
                    num_groups = config.explorer.tasks_per_step
                else:
                    _, num_groups, metrics = await stop.until(produced.get())
                if num_groups == 0:
                    empty_in_a_row += 1
                    logger.warning("step %d: no episode produced samples; nothing to train", step)
                    last = {**metrics, "train/skipped": 1.0}
                    monitor.log(step, last)
                    if empty_in_a_row >= MAX_EMPTY_STEPS:
                        raise RuntimeError(
                            f"{MAX_EMPTY_STEPS} steps in a row produced no training samples "
                            "(every episode failed or made no model call); the errors are in "
                            f"{run_dir / 'rollouts.jsonl'}"
                        )
                    await finish_step(step + 1)
                    continue
                empty_in_a_row = 0
                samples = await stop.until(
                    buffer.get(
                        num_groups,
                        step=step,
                        min_policy_version=max(0, policy_version - stale_limit),
                        timeout=config.run.get_timeout,
                    )
                )
                if mix_demos and offline is not None:  # CHORD: demonstrations beside rollouts
                    samples = [*samples, *next(offline)]
            if config.run.deterministic:
                samples = ordered(samples)  # not in the order episodes finished
            progress.reset("train", total=1)  # a step once begun finishes, even on a stop
            metrics.update(await in_own_thread(trainer.step, samples, step))
            progress.advance("train")
            done = step + 1
            if engine is not None and not stop.requested:
                metrics["time/sync"] = await _sync_weights(engine, trainer, version=done)
            policy_version = done
            metrics["time/step"] = time.perf_counter() - step_started
            saved: dict[str, Any] | None = None
            if (
                done == steps
                or stop.requested
                or (config.run.checkpoint_every and done % config.run.checkpoint_every == 0)
            ):
                saving = time.perf_counter()
                saved = await save_checkpoint(done)  # before the explorer moves on (sync mode)
                metrics["time/checkpoint"] = time.perf_counter() - saving
            await finish_step(done)
            metrics["policy_version"] = float(done)
            last = metrics
            monitor.log(step, metrics)
            if saved is not None:
                # state.json names the checkpoint only once its step is logged: a run killed in
                # between resumes from the one before and redoes this step (superseding its line).
                commit_checkpoint(saved)
            progress.advance("run")
            if config.run.eval_every and done % config.run.eval_every == 0:
                await stop.until(evaluate(done))

    saved_at = start if resume else None

    async def save_checkpoint(done: int) -> dict[str, Any]:
        """Save the weights and optimizer of step `done`; returns the run state to commit."""
        nonlocal saved_at
        saved_at = done
        target = checkpoint_dir(run_dir, done)
        await in_own_thread(trainer.save, target)
        await in_own_thread(trainer.export_hf, target / "model")
        saved: dict[str, Any] = {"step": done}
        if sampler is not None:  # resume re-explores from the first batch not yet trained
            saved["sampler"] = sampler_states.get(done, sampler.state_dict())
        return saved

    def commit_checkpoint(saved: dict[str, Any]) -> None:
        write_state(run_dir, saved)
        prune_checkpoints(run_dir, config.run.keep_checkpoints)

    try:
        with monitor, monitor.progress() as progress:
            progress.reset("run", total=steps, completed=start)
            if start == 0 and config.run.eval_every:
                await _until_stopped(stop.until(evaluate(0)))
            if not stop.requested:
                jobs = [_until_stopped(train_loop(progress))]
                if explorer is not None:
                    jobs.append(_until_stopped(explore_loop(progress)))
                await _run_together(jobs)
            if stop.requested and saved_at != steps_done:
                # what was trained so far, and where to resume
                commit_checkpoint(await save_checkpoint(steps_done))
    finally:
        if explorer is not None:
            await explorer.close()
        if gateway is not None:
            await gateway.stop()
        if engine is not None:
            await engine.close()
        await buffer.close()
        trainer.close()
    if stop.requested and steps_done < steps:
        reason = stop.reason or "request"
        raise RunStopped(
            reason,
            f"stopped on {reason} after step {steps_done} of {steps} (checkpoint saved); "
            f"continue with `agentscope-rft train --resume {run_dir}`",
        )
    return last


async def explore_step(
    explorer: Explorer, sampler: TaskSampler, config: RunConfig, step: int, progress: Any
) -> tuple[ExploreResult, list[list[Sample]], dict[str, float]]:
    """Explore one training step's tasks: the batch's result, its samples by group (what goes
    into the buffer) and the step's dynamic-sampling metrics.

    Without `explorer.dynamic_sampling` that is one batch of `tasks_per_step` tasks and all its
    groups. With it, further batches follow while fewer than `tasks_per_step` groups have
    rewards that differ (see `DynamicSamplingConfig`); only those groups are returned, the first
    `tasks_per_step` of them (or every group, when none differs: the trainer then counts them
    and skips the step).
    """
    want = config.explorer.tasks_per_step
    group_size = config.explorer.group_size
    dynamic = config.explorer.dynamic_sampling
    results: list[ExploreResult] = []
    useful: dict[str, list[Sample]] = {}
    explored = equal = 0
    size = want
    for batch in range(dynamic.max_batches if dynamic is not None else 1):
        tasks = sampler.next_batch(size)
        progress.reset("explore", total=len(tasks) * group_size)
        result = await explorer.explore(
            tasks,
            group_size=group_size,
            batch_id=f"s{step}" if batch == 0 else f"s{step}b{batch}",
            on_rollout=lambda _: progress.advance("explore"),
        )
        results.append(result)
        if dynamic is None:
            return result, list(group_samples(result.samples).values()), {}
        kept, dropped = (
            drop_zero_variance(result.samples, config.algorithm, pad_id=0)
            if result.samples
            else ([], 0)
        )
        useful.update(group_samples(kept))
        explored += len(tasks)
        equal += dropped
        missing = want - len(useful)
        if missing <= 0:
            break
        # About as many tasks as should yield the missing groups at the share seen so far.
        share = len(useful) / explored
        size = min(want, math.ceil(missing / share)) if share > 0 else want
    combined = ExploreResult.combine(results)
    groups = list(useful.values())[:want] or list(group_samples(combined.samples).values())
    metrics = {
        "explore/batches": float(len(results)),
        "explore/tasks": float(explored),
        "explore/groups_equal_reward": float(equal),
        "explore/groups_kept": float(min(len(useful), want)),
        "explore/groups_surplus": float(max(0, len(useful) - want)),
    }
    if len(useful) < want:
        logger.info(
            "step %d: %d of %d groups with differing rewards after %d batches (%d tasks); "
            "training on those",
            step,
            len(useful),
            want,
            len(results),
            explored,
        )
    return combined, groups, metrics


async def _until_stopped(job: Awaitable[None]) -> None:
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
