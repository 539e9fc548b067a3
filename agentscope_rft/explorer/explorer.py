"""The explorer: runs many episodes of a workflow concurrently and turns them into samples.

Each episode runs in its own asyncio task inside a rollout scope, so its model calls (the
injected model's, or the app's own redirected ones) are recorded under its rollout id. An episode
that raises or exceeds its timeout is retried up to `max_retries` times with a fresh rollout id;
if it still fails it becomes a failed rollout carrying the error text. It never fails the batch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from agentscope_rft.api import Workflow
from agentscope_rft.explorer.runner import (
    EpisodeFailed,
    EpisodeRunner,
    InProcessRunner,
    ModelSettings,
    WorkflowReturnError,
    as_reward,
)
from agentscope_rft.explorer.tasks import Task
from agentscope_rft.explorer.trajectory import RewardSpread, TrajectoryStats, build_samples
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.integration.agentscope import RolloutScope
from agentscope_rft.types import Rollout, RolloutStatus, Sample

logger = logging.getLogger(__name__)

__all__ = ["EpisodeSettings", "ExploreResult", "Explorer", "WorkflowReturnError", "as_reward"]


@dataclass(frozen=True)
class EpisodeSettings:
    """How episodes run (the explorer section of the run config maps onto this)."""

    episode_timeout: float = 300.0
    max_retries: int = 1
    max_concurrency: int = 32
    model_stream: bool = False
    max_tokens: int | None = None
    reward_spread: RewardSpread = "outcome"
    reward_gamma: float = 1.0
    success_threshold: float = 1.0
    max_sample_length: int | None = None


@dataclass
class ExploreResult:
    """One batch of episodes: rollouts (failed ones included), samples and statistics."""

    rollouts: list[Rollout]
    samples: list[Sample]
    trajectory: TrajectoryStats
    seconds: float
    no_model_calls: list[str] = field(default_factory=list)
    runtime: dict[str, float] = field(default_factory=dict)
    """The episode runners' counters over this batch (e.g. `runtime/runner_deaths`)."""

    def metrics(self) -> dict[str, float]:
        ok = [r for r in self.rollouts if r.ok]
        rewards = [r.reward for r in ok]
        n = len(self.rollouts)
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)) if rewards else 0.0
        completion = [len(c.completion_ids) for r in ok for c in r.calls]
        out = {
            "reward/mean": mean,
            "reward/std": std,
            "reward/min": min(rewards, default=0.0),
            "reward/max": max(rewards, default=0.0),
            "success_rate": sum(r.success for r in ok) / n if n else 0.0,
            "rollouts_per_s": n / self.seconds if self.seconds > 0 else 0.0,
            "explore/rollouts": float(n),
            "explore/failed": float(sum(r.status is RolloutStatus.FAILED for r in self.rollouts)),
            "explore/timeout": float(sum(r.status is RolloutStatus.TIMEOUT for r in self.rollouts)),
            "explore/retried": float(sum(r.attempts > 1 for r in self.rollouts)),
            "explore/no_model_calls": float(len(self.no_model_calls)),
            "explore/calls_per_episode": sum(len(r.calls) for r in ok) / len(ok) if ok else 0.0,
            "response_length/mean": sum(completion) / len(completion) if completion else 0.0,
            "time/explore": self.seconds,
        }
        out.update(self.trajectory.metrics())
        out.update(self.runtime)
        return out


def _error_text(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines)
    return text if len(text) < 4000 else "...\n" + text[-4000:]


class Explorer:
    """Runs a workflow's episodes against the gateway.

    Example:
        >>> explorer = Explorer(workflow, gateway, EpisodeSettings())  # doctest: +SKIP
        >>> result = await explorer.explore(tasks, group_size=4, batch_id="step1")  # doctest: +SKIP
    """

    def __init__(
        self,
        workflow: Workflow,
        gateway: Gateway,
        settings: EpisodeSettings,
        runner: EpisodeRunner | None = None,
    ) -> None:
        self.workflow = workflow
        self.gateway = gateway
        self.settings = settings
        self.runner = runner or InProcessRunner(workflow, self.model_settings())
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(3600.0, connect=10.0),
            limits=httpx.Limits(max_connections=max(64, settings.max_concurrency * 2)),
        )
        self._warned_no_calls = False

    def model_settings(self) -> ModelSettings:
        """How the model handed to the workflow is built (runners in other processes need it)."""
        return ModelSettings(
            model_name=self.gateway.engine.model_name,
            stream=self.settings.model_stream,
            max_tokens=self.settings.max_tokens,
        )

    async def close(self) -> None:
        await self.runner.close()
        await self._http.aclose()

    async def run_episode(self, task: Task, rollout_id: str | None = None) -> Rollout:
        """Run one episode (with retries); never raises for a failing episode."""
        rollout_id = rollout_id or uuid.uuid4().hex
        started = time.time()
        attempts = self.settings.max_retries + 1
        status, error, runner = RolloutStatus.FAILED, "", None
        for attempt in range(attempts):
            attempt_id = rollout_id if attempt == 0 else f"{rollout_id}.retry{attempt}"
            scope = RolloutScope(
                rollout_id=attempt_id,
                base_url=self.gateway.rollout_base_url(attempt_id),
                api_key=self.gateway.api_key or "no-key",
                http_client=self._http,
            )
            try:
                async with self._limit:
                    outcome = await self.runner.run(task.data, scope, self.settings.episode_timeout)
                reward = outcome.reward
                calls = await self.gateway.recorder.take(attempt_id)
                success = (
                    reward.success
                    if reward.success is not None
                    else reward.value >= self.settings.success_threshold
                )
                return Rollout(
                    rollout_id=attempt_id,
                    task_id=task.id,
                    task=task.data,
                    calls=calls,
                    reward=reward.value,
                    success=success,
                    step_rewards=[*scope.step_rewards, *outcome.step_rewards],
                    metrics=dict(reward.metrics),
                    started_at=started,
                    finished_at=time.time(),
                    attempts=attempt + 1,
                    runner=outcome.runner,
                )
            except TimeoutError as exc:
                status, runner = RolloutStatus.TIMEOUT, getattr(exc, "runner", None)
                error = f"the episode exceeded episode_timeout={self.settings.episode_timeout}s"
            except (WorkflowReturnError, EpisodeFailed) as exc:
                status, error = RolloutStatus.FAILED, str(exc)
                runner = getattr(exc, "runner", None)
            except Exception as exc:
                status, error = RolloutStatus.FAILED, _error_text(exc)
            await self.gateway.abort_rollout(attempt_id)
            calls = await self.gateway.recorder.take(attempt_id, wait_timeout=1.0)
            if attempt + 1 < attempts:
                logger.debug("episode %s failed (%s); retrying", attempt_id, status)
        return Rollout(
            rollout_id=attempt_id,
            task_id=task.id,
            task=task.data,
            calls=calls,
            reward=0.0,
            status=status,
            error=error,
            started_at=started,
            finished_at=time.time(),
            attempts=attempts,
            runner=runner,
        )

    async def explore(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int,
        batch_id: str,
        on_rollout: Callable[[Rollout], None] | None = None,
    ) -> ExploreResult:
        """Run `group_size` episodes of every task concurrently; build their samples."""
        started = time.perf_counter()
        stats = TrajectoryStats()
        samples: list[Sample] = []
        no_calls: list[str] = []

        async def one(task: Task, index: int) -> Rollout:
            rollout = await self.run_episode(task, f"{batch_id}.{index}")
            if on_rollout is not None:
                on_rollout(rollout)
            return rollout

        jobs = [
            one(task, i * group_size + g) for i, task in enumerate(tasks) for g in range(group_size)
        ]
        rollouts = list(await asyncio.gather(*jobs))
        for rollout in rollouts:
            if not rollout.ok:
                continue
            if not rollout.calls:
                no_calls.append(rollout.task_id)
                continue
            built, built_stats = build_samples(
                rollout,
                group_id=f"{batch_id}:{rollout.task_id}",
                reward_spread=self.settings.reward_spread,
                gamma=self.settings.reward_gamma,
                max_length=self.settings.max_sample_length,
            )
            samples.extend(built)
            stats.merge(built_stats)
        if no_calls and not self._warned_no_calls:
            self._warned_no_calls = True
            logger.warning(
                "%d episode(s) made no model call through the trainable endpoint (e.g. task %s): "
                "does the workflow use its `model` argument or an AgentScope OpenAIChatModel? "
                "Calls through other clients are not captured.",
                len(no_calls),
                no_calls[0],
            )
        failed = [r for r in rollouts if not r.ok]
        if failed:
            logger.warning(
                "%d of %d episodes failed; first error (task %s): %s",
                len(failed),
                len(rollouts),
                failed[0].task_id,
                (failed[0].error or "").strip().splitlines()[-1][:300],
            )
        return ExploreResult(
            rollouts=rollouts,
            samples=samples,
            trajectory=stats,
            seconds=time.perf_counter() - started,
            no_model_calls=no_calls,
            runtime=self.runner.take_metrics(),
        )
