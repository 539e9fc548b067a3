"""The local runtime: one process, asyncio; engine, gateway, explorer, buffer and trainer together.

`train` runs a `TrainingRun` (`runtime/training.py`: the loop, step by named step). With
`runtime: ray` the loop is the same; only the episodes run elsewhere (in runner processes on a Ray
cluster, see `agentscope_rft.runtime.ray`). `explore_step` explores one training step's tasks.
"""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path
from typing import Any

from agentscope_rft.buffer.base import group_samples
from agentscope_rft.config import RunConfig
from agentscope_rft.data.selection import TaskSelector
from agentscope_rft.engines.base import Engine
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer, ExploreResult
from agentscope_rft.explorer.runner import EpisodeRunner, ModelSettings
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.runtime.components import RunFolderError
from agentscope_rft.runtime.deterministic import deterministic_config
from agentscope_rft.runtime.disk import (
    disk_full_error,
    filenames,
    folder_gone,
    is_disk_full,
    sqlite_files,
)
from agentscope_rft.runtime.memory import apply_allocator, limit_kernel_cache
from agentscope_rft.runtime.preflight import Checked, preflight
from agentscope_rft.runtime.signals import RunStop
from agentscope_rft.runtime.training import TrainingRun
from agentscope_rft.trainers.common import drop_zero_variance
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)


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
    apply_allocator(config.run.allocator)  # before the model and the trainer allocate
    limit_kernel_cache()
    try:
        if config.runtime.type == "local":
            return await TrainingRun(config, run_dir, resume, stop, checked, ray_runtime=None).run()
        return await _train_on_ray(config, run_dir, resume, stop, checked)
    except RunFolderError:  # (a full disk said so already)
        raise
    except Exception as exc:
        if not run_dir.is_dir() and any(run_dir in Path(f).parents for f in filenames(exc)):
            raise folder_gone(run_dir) from exc
        if is_disk_full(exc):  # a metrics line, a rollout, the buffer: named, not a traceback
            raise disk_full_error(run_dir, exc, sqlite_files(config.buffer)) from exc
        raise


async def _train_on_ray(
    config: RunConfig, run_dir: Path, resume: bool, stop: RunStop, checked: Checked
) -> dict[str, float]:
    from agentscope_rft.runtime.ray import RayRuntime

    # Joined (or started) and checked before any work, so the trainer's Ray ranks join it too.
    ray_runtime = await asyncio.to_thread(RayRuntime, config)
    try:
        run = TrainingRun(config, run_dir, resume, stop, checked, ray_runtime=ray_runtime)
        return await run.run()
    finally:
        ray_runtime.close()


async def episode_runner(
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


async def explore_step(
    explorer: Explorer, sampler: TaskSelector, config: RunConfig, step: int, progress: Any
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
