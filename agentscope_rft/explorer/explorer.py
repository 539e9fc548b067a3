"""The explorer: runs many episodes of a workflow concurrently and turns them into samples.

Each episode runs in its own asyncio task inside a rollout scope, so its model calls (the
injected model's, or the app's own redirected ones) are recorded under its rollout id. An episode
that raises or exceeds its timeout is retried up to `max_retries` times with a fresh rollout id;
if it still fails it becomes a failed rollout carrying the error text. It never fails the batch.
An episode cut short by a limit is data, not a failure: one whose conversation outgrew the
context window (the app's call got the engine's error) and one whose reward says `truncated`
(the app's turn limit) are recorded with status `truncated`, their calls kept and trained.
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
from typing import Any

import httpx
from agentscope.model import OpenAIChatModel

from agentscope_rft.api import Workflow
from agentscope_rft.explorer.tasks import Task
from agentscope_rft.explorer.trajectory import RewardSpread, TrajectoryStats, build_samples
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.integration.agentscope import RolloutScope, rollout_model, rollout_scope
from agentscope_rft.types import Call, Reward, Rollout, RolloutStatus, Sample

logger = logging.getLogger(__name__)


class WorkflowReturnError(TypeError):
    """The workflow (or judge) returned something that is not a reward."""


def as_reward(value: Any, source: str) -> Reward:
    if isinstance(value, Reward):
        return value
    if isinstance(value, bool | int | float) and math.isfinite(float(value)):
        return Reward(float(value))
    raise WorkflowReturnError(
        f"the {source} returned {type(value).__name__} {value!r:.80}; it must return a finite "
        "float or agentscope_rft.Reward (a workflow with a judge may return any response)"
    )


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
    context_overflow_reward: float = 0.0


@dataclass
class ExploreResult:
    """One batch of episodes: rollouts (failed ones included), samples and statistics."""

    rollouts: list[Rollout]
    samples: list[Sample]
    trajectory: TrajectoryStats
    seconds: float
    no_model_calls: list[str] = field(default_factory=list)

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
            "explore/truncated": float(
                sum(r.status is RolloutStatus.TRUNCATED for r in self.rollouts)
            ),
            "explore/retried": float(sum(r.attempts > 1 for r in self.rollouts)),
            "explore/no_model_calls": float(len(self.no_model_calls)),
            "explore/calls_per_episode": sum(len(r.calls) for r in ok) / len(ok) if ok else 0.0,
            "response_length/mean": sum(completion) / len(completion) if completion else 0.0,
            "time/explore": self.seconds,
        }
        out.update(self.trajectory.metrics())
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

    def __init__(self, workflow: Workflow, gateway: Gateway, settings: EpisodeSettings) -> None:
        self.workflow = workflow
        self.gateway = gateway
        self.settings = settings
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(3600.0, connect=10.0),
            limits=httpx.Limits(max_connections=max(64, settings.max_concurrency * 2)),
        )
        self._warned_no_calls = False

    async def close(self) -> None:
        await self._http.aclose()

    def _model(self, scope: RolloutScope) -> OpenAIChatModel:
        parameters = OpenAIChatModel.Parameters(max_tokens=self.settings.max_tokens)
        return rollout_model(
            scope,
            self.gateway.engine.model_name,
            stream=self.settings.model_stream,
            parameters=parameters,
        )

    async def _attempt(self, task: Task, scope: RolloutScope) -> Reward:
        with rollout_scope(scope):
            model = self._model(scope)
            result = await asyncio.wait_for(
                self.workflow.fn(dict(task.data), model), self.settings.episode_timeout
            )
        if self.workflow.judge is not None:
            with rollout_scope(None):  # the judge's own model calls are not the policy's
                return as_reward(await self.workflow.judge(dict(task.data), result), "judge")
        return as_reward(result, f"workflow `{self.workflow.name}`")

    async def run_episode(self, task: Task, rollout_id: str | None = None) -> Rollout:
        """Run one episode (with retries); never raises for a failing episode."""
        rollout_id = rollout_id or uuid.uuid4().hex
        started = time.time()
        attempts = self.settings.max_retries + 1
        status, error = RolloutStatus.FAILED, ""
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
                    reward = await self._attempt(task, scope)
                calls = await self.gateway.recorder.take(attempt_id)
                overflow = self.gateway.recorder.pop_overflow(attempt_id)
                truncated = reward.truncated or ("context_window" if overflow else None)
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
                    status=RolloutStatus.TRUNCATED if truncated else RolloutStatus.OK,
                    error=overflow,
                    truncated=truncated,
                    success=success,
                    step_rewards=scope.step_rewards,
                    metrics=dict(reward.metrics),
                    started_at=started,
                    finished_at=time.time(),
                    attempts=attempt + 1,
                )
            except TimeoutError:
                status = RolloutStatus.TIMEOUT
                error = f"the episode exceeded episode_timeout={self.settings.episode_timeout}s"
            except WorkflowReturnError as exc:
                status, error = RolloutStatus.FAILED, str(exc)
            except Exception as exc:
                status, error = RolloutStatus.FAILED, _error_text(exc)
            await self.gateway.abort_rollout(attempt_id)
            calls = await self.gateway.recorder.take(attempt_id, wait_timeout=1.0)
            overflow = self.gateway.recorder.pop_overflow(attempt_id)
            if overflow is not None and status is RolloutStatus.FAILED:
                return self._overflowed(task, attempt_id, calls, overflow, started, attempt + 1)
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
        )

    def _overflowed(
        self,
        task: Task,
        rollout_id: str,
        calls: list[Call],
        error: str,
        started: float,
        attempts: int,
    ) -> Rollout:
        """An episode whose conversation outgrew the context window: the calls it made are data
        (a policy that rambles should learn from it), with `context_overflow_reward`."""
        return Rollout(
            rollout_id=rollout_id,
            task_id=task.id,
            task=task.data,
            calls=calls,
            reward=self.settings.context_overflow_reward,
            status=RolloutStatus.TRUNCATED,
            error=error,
            truncated="context_window",
            started_at=started,
            finished_at=time.time(),
            attempts=attempts,
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
        )
