"""`agentscope-rft explore`: run a workflow over a task set without training (a baseline).

Samples go to the buffer (an SQLite file by default, so they can be exported or trained on
later with `run.mode: train_only`) after `data.operators` (filters, judges), per-task results (the
workflow's own rewards) to `results.jsonl`, a summary to `summary.json`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentscope_rft.api import load_workflow
from agentscope_rft.buffer.base import group_samples
from agentscope_rft.buffer.config import DEFAULT_SQLITE_NAME, BufferConfig, build_buffer
from agentscope_rft.config import RunConfig, dump_config
from agentscope_rft.data.operators import Pipeline
from agentscope_rft.data.side import (
    build_operator,
    check_judges,
    close_operators,
    groups_from_explored,
)
from agentscope_rft.engines.base import check_engine, engine_metrics
from agentscope_rft.engines.factory import build_engine
from agentscope_rft.explorer.diagnosis import RunDiagnosis
from agentscope_rft.explorer.explorer import Explorer, ExploreResult, stratum_metrics
from agentscope_rft.explorer.runner import ModelSettings
from agentscope_rft.explorer.tasks import Task, load_tasks, stratified_slice
from agentscope_rft.explorer.trajectory import TrajectoryStats
from agentscope_rft.files import replace_text
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.runtime.components import (
    RolloutLog,
    RunFolderError,
    episode_settings,
    max_tokens_per_call,
    sampling_rules,
    unwritable,
)
from agentscope_rft.runtime.disk import explore_disk_full, is_disk_full
from agentscope_rft.runtime.memory import apply_allocator, limit_kernel_cache
from agentscope_rft.runtime.signals import RunStop, RunStopped, Stopping
from agentscope_rft.types import Rollout

logger = logging.getLogger(__name__)


def _task_result(task_id: str, rollouts: list[Rollout]) -> dict[str, Any]:
    """One line of `results.jsonl`: the task's rewards, and the mean of each metric its episodes
    reported (`Reward(metrics=...)`, e.g. a search answer's F1 beside the reward built on it)."""
    ok = [r for r in rollouts if r.ok]
    rewards = [r.reward for r in ok]
    metrics: dict[str, list[float]] = {}
    for rollout in ok:
        for key, value in rollout.metrics.items():
            metrics.setdefault(key, []).append(value)
    return {
        "task_id": task_id,
        "rewards": [r.reward if r.ok else None for r in rollouts],
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "metrics": {key: sum(values) / len(values) for key, values in sorted(metrics.items())},
        "success_rate": sum(r.success for r in rollouts) / len(rollouts) if rollouts else None,
        "failed": sum(not r.ok for r in rollouts),
        "errors": sorted(
            {
                (r.error or "").strip().splitlines()[-1][:200]
                for r in rollouts
                if not r.ok and r.error
            }
        ),
    }


SPLITS = ("train", "val", "test", "eval")
"""`explore --split` values (`eval` is the test split's older name)."""


def _clear_earlier_buffer(path: Path) -> None:
    """Delete the buffer an earlier explore (finished or killed) left in the output folder: its
    results are replaced, and its samples would sit beside this run's twice over (a later
    `train_only` would train those tasks twice). A buffer at `buffer.url` is shared and kept."""
    if not path.exists():
        return
    logger.warning("explore: replacing the samples of an earlier explore in %s", path)
    for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        leftover.unlink(missing_ok=True)


def split_tasks(config: RunConfig, split: str) -> list[Task]:
    """The tasks of a split for `explore`: `val_limit`'s slice of val, every task otherwise.

    Raises:
        ValueError: an unknown split, or one the config does not set.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    key = {"train": "train", "val": "val", "test": "eval", "eval": "eval"}[split]
    source = getattr(config.tasks, key)
    if source is None:
        raise ValueError(f"tasks.{key} is not set in the config (explore --split {split})")
    tasks = load_tasks(
        source, id_field=config.tasks.id_field, required_fields=config.tasks.required_fields
    )
    if key == "val":
        return stratified_slice(tasks, config.tasks.val_limit, config.tasks.stratify_field)
    return tasks


def tested_model(out_dir: Path) -> str | None:
    """The model an explore folder's `config.yaml` names (None: no readable config)."""
    try:
        config = yaml.safe_load((out_dir / "config.yaml").read_text())
        name = config["model"]["name_or_path"]
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        return None
    return str(name) if name else None


def warn_second_look(out_dir: Path, split: str, model: str) -> None:
    """Say so when a test-split evaluation replaces one `out_dir` holds: a second look at test.

    Example:
        >>> warn_second_look(Path("runs/x/explore-test"), "test", "my-model")  # doctest: +SKIP
    """
    if split not in ("test", "eval") or not (out_dir / "summary.json").is_file():
        return
    logger.warning(
        "%s holds a test-split evaluation already (of %s); this one, of %s, replaces it: a second "
        "look at the test split. A claim reports its first look; choose nothing by comparing them",
        out_dir,
        tested_model(out_dir) or "a model its folder does not name",
        model,
    )


async def explore(
    config: RunConfig,
    out_dir: Path,
    *,
    split: str = "train",
    limit: int | None = None,
    group_size: int | None = None,
    stop: RunStop | None = None,
) -> dict[str, float]:
    """Explore every task of a split; returns the summary metrics.

    `stop` (the CLI routes SIGINT/SIGTERM to it) ends early: the batch in flight is cancelled,
    the finished tasks' results and summary are written, then `RunStopped` is raised.

    Example:
        >>> summary = asyncio.run(explore(config, Path("runs/x/explore")))  # doctest: +SKIP
    """
    stop = stop or RunStop()
    apply_allocator(config.run.allocator)  # before the model allocates
    limit_kernel_cache()
    try:
        if config.runtime.type == "local":
            return await _explore(config, out_dir, split, limit, group_size, stop, None)
        from agentscope_rft.runtime.ray import RayRuntime

        ray_runtime = await asyncio.to_thread(RayRuntime, config)
        try:
            return await _explore(config, out_dir, split, limit, group_size, stop, ray_runtime)
        finally:
            ray_runtime.close()
    except Exception as exc:
        if is_disk_full(exc) and not isinstance(exc, RunFolderError):  # (said already)
            raise explore_disk_full(out_dir, exc) from exc
        raise


async def _explore(
    config: RunConfig,
    out_dir: Path,
    split: str,
    limit: int | None,
    group_size: int | None,
    stop: RunStop,
    ray_runtime: Any,
) -> dict[str, float]:
    tasks = split_tasks(config, split)[:limit]
    workflow = load_workflow(config.workflow or "", config.judge)
    groups = group_size or (
        config.explorer.group_size if split == "train" else config.explorer.eval_group_size
    )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        replace_text(out_dir / "config.yaml", dump_config(config))
    except OSError as exc:  # a read-only or full disk: before the model loads
        raise unwritable(out_dir, exc) from exc
    warn_second_look(out_dir, split, config.model.name_or_path)
    buffer_config = config.buffer
    if buffer_config.type == "memory":
        logger.info(
            "explore keeps its samples: buffer.type memory -> sql (%s)", out_dir / "buffer.db"
        )
        buffer_config = BufferConfig(type="sql")
    check_judges(config.data)
    if buffer_config.url is None:
        _clear_earlier_buffer(out_dir / DEFAULT_SQLITE_NAME)
    buffer = build_buffer(buffer_config, out_dir)
    engine = build_engine(config.model, config.engine, out_dir / "logs", config.gpus)
    if ray_runtime is not None:
        ray_runtime.host_engine(engine)  # vLLM replicas under actors on the cluster's nodes
    await engine.start()
    results_path = out_dir / "results.jsonl"
    results_path.write_text("")
    for earlier in ("summary.json", "diagnosis.jsonl"):  # of an earlier explore (killed or not)
        (out_dir / earlier).unlink(missing_ok=True)
    log = RolloutLog(out_dir / "rollouts.jsonl")
    log.path.write_text("")
    all_rollouts: list[Rollout] = []
    data_metrics: dict[str, float] = {}
    stats = TrajectoryStats()
    started = time.perf_counter()
    rules = sampling_rules(config)
    if split != "train":
        rules[""] = rules["eval"]
    try:
        # Runners on other machines reach the gateway at the configured interface.
        host = config.gateway.host if ray_runtime is not None else "127.0.0.1"
        async with Gateway(
            engine,
            sampling_overrides=rules,
            seed_base=config.explorer.seed,
            generate_api_key=True,
            host=host,
            max_tokens_limit=max_tokens_per_call(config, engine.max_model_len),
            runtime_state=config.gateway.runtime_state,
        ) as gateway:
            settings = episode_settings(config, engine.max_model_len)
            runner = None
            if ray_runtime is not None:
                await ray_runtime.place_weights(engine, out_dir)
                model = ModelSettings(engine.model_name, settings.model_stream, settings.max_tokens)
                runner = await ray_runtime.episode_runner(config, model, gateway.port)
            explorer = Explorer(workflow, gateway, settings, runner=runner)
            # data.operators act on what enters the buffer, as in a training run
            pipeline = Pipeline(
                [
                    build_operator(
                        op,
                        policy_url=gateway.base_url,
                        policy_model=engine.model_name,
                        policy_key=gateway.api_key,
                    )
                    for op in config.data.operators
                ]
            )
            chunk = max(1, config.explorer.max_concurrency // groups)
            columns = [
                TextColumn("exploring"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            ]
            with Progress(*columns, transient=True) as progress:
                bar = progress.add_task("episodes", total=len(tasks) * groups)
                for first in range(0, len(tasks), chunk):
                    try:
                        result: ExploreResult = await stop.until(
                            explorer.explore(
                                tasks[first : first + chunk],
                                group_size=groups,
                                batch_id=f"{split}{first}",
                                on_rollout=lambda _: progress.advance(bar),
                            )
                        )
                    except Stopping:
                        break
                    log.write(0, split, result)
                    stats.merge(result.trajectory)
                    all_rollouts.extend(result.rollouts)
                    groups_now = list(group_samples(result.samples).values())
                    if pipeline and groups_now:
                        kept, op_metrics = await pipeline(
                            groups_from_explored(result.rollouts, groups_now)
                        )
                        groups_now = [g.samples for g in kept]
                        for key, value in op_metrics.items():
                            data_metrics[key] = data_metrics.get(key, 0.0) + value
                    for group in groups_now:
                        await buffer.put(group)
                    with open(results_path, "a") as handle:
                        for task in tasks[first : first + chunk]:
                            mine = [r for r in result.rollouts if r.task_id == task.id]
                            handle.write(json.dumps(_task_result(task.id, mine)) + "\n")
                    check_engine(engine)  # a dead server would fail every later episode
            await explorer.close()
            await close_operators(pipeline)
        counters = engine_metrics(engine)
    finally:
        await engine.close()
        await buffer.close()
    summary = ExploreResult(all_rollouts, [], stats, time.perf_counter() - started).metrics()
    if config.tasks.stratify_field:
        summary.update(stratum_metrics(all_rollouts, config.tasks.stratify_field))
    summary.update(counters)
    summary.update(data_metrics)
    summary.update(RunDiagnosis(out_dir).first(0, split, all_rollouts))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if stop.requested:
        done = len(all_rollouts) // groups
        raise RunStopped(
            stop.reason or "request",
            f"stopped on {stop.reason} after {done} of {len(tasks)} tasks; their results are in "
            f"{results_path}",
        )
    return summary
