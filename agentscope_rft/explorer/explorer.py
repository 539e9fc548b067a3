"""The explorer: runs many episodes of a workflow concurrently and turns them into samples.

Each episode runs in its own asyncio task inside a rollout scope, so its model calls (the
injected model's, or the app's own redirected ones) are recorded under its rollout id. An episode
that raises or exceeds its timeout is retried up to `max_retries` times with a fresh rollout id;
if it still fails it becomes a failed rollout carrying the error text. It never fails the batch.
An episode cut short by a limit is data, not a failure: one whose conversation outgrew the
context window (the app's call got the engine's error) and one whose reward says `truncated`
(the app's turn limit) are recorded with status `truncated`, their calls kept and trained.

Episodes are bounded whatever the app does. At the deadline the explorer closes the rollout at the
gateway first (calls in flight are aborted at the engine, new calls under its id are refused) and
only then cancels the episode's task: AgentScope's models catch the cancellation and return an
"interrupted" response, so cancelling alone would let the agent carry on. An episode that still
does not end is left behind (it can no longer reach the model) rather than waited for. When an
episode returns, calls it left in flight (background tasks) get `late_call_grace` seconds, then
are aborted; both are counted (`episode/late_calls`, `episode/aborted_calls`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import os
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from agentscope.model import OpenAIChatModel

from agentscope_rft.api import Workflow
from agentscope_rft.chat.tools import invalid_tool_call
from agentscope_rft.explorer.agents import AgentsConfig, UnseenAgentWarning
from agentscope_rft.explorer.loop_monitor import LoopMonitor, LoopStats
from agentscope_rft.explorer.runner import (
    EpisodeFailed,
    EpisodeOutcome,
    EpisodeRunner,
    EpisodeTimeout,
    WorkflowReturnError,
    as_reward,
    guarded,
)
from agentscope_rft.explorer.tasks import Task
from agentscope_rft.explorer.trajectory import RewardSpread, TrajectoryStats, build_samples
from agentscope_rft.gateway.app import RolloutClosure
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.integration.agentscope import RolloutScope, rollout_model, rollout_scope
from agentscope_rft.types import Call, Reward, Rollout, RolloutStatus, Sample

logger = logging.getLogger(__name__)

__all__ = [
    "EpisodeSettings",
    "EpisodeTimeout",
    "ExploreResult",
    "Explorer",
    "WorkflowReturnError",
    "as_reward",
]

CANCEL_GRACE = 2.0
"""Seconds an episode gets to unwind after its rollout is closed and its task cancelled."""


def default_max_tokens_per_call(max_model_len: int) -> int:
    """The per-call completion limit when `explorer.max_tokens_per_call` is not set.

    A quarter of the context window: a call may still write a long answer, but an app that sets
    no `max_tokens` cannot sample until the context is full on every call.

    Example:
        >>> default_max_tokens_per_call(8192)
        2048
    """
    return max(16, max_model_len // 4)


POOL_SIZE = 32
"""Episodes per HTTP connection pool (each pool keeps up to twice as many connections)."""
POOL_SHARDS = 64


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
    late_call_grace: float = 2.0
    """Seconds an episode's calls still in flight after it returned may take before abort."""
    context_overflow_reward: float = 0.0
    """Reward of an episode whose conversation outgrew the context window (kept as data)."""
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    """Which agents' calls become samples (`explorer.agents`)."""


_RUNTIME_GAUGES = frozenset({"runtime/runners", "runtime/runner_processes"})


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
    loop: LoopStats | None = None
    """What the event-loop monitors saw while the episodes ran (here, or in runner processes)."""

    @classmethod
    def combine(cls, results: Sequence[ExploreResult]) -> ExploreResult:
        """The batches of one step (dynamic sampling) as one result: rollouts, samples and
        statistics together, seconds and the runners' counters summed (their gauges, the
        runners and runner processes in use, taken at their largest)."""
        stats = TrajectoryStats()
        runtime: dict[str, float] = {}
        loop: LoopStats | None = None
        for result in results:
            stats.merge(result.trajectory)
            if result.loop is not None:
                loop = loop or LoopStats()
                loop.merge(result.loop)
            for key, value in result.runtime.items():
                if key in _RUNTIME_GAUGES:
                    runtime[key] = max(runtime.get(key, value), value)
                else:
                    runtime[key] = runtime.get(key, 0.0) + value
        return cls(
            rollouts=[r for result in results for r in result.rollouts],
            samples=[s for result in results for s in result.samples],
            trajectory=stats,
            seconds=sum(result.seconds for result in results),
            no_model_calls=[t for result in results for t in result.no_model_calls],
            runtime=runtime,
            loop=loop,
        )

    def metrics(self) -> dict[str, float]:
        ok = [r for r in self.rollouts if r.ok]
        rewards = [r.reward for r in ok]
        n = len(self.rollouts)
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)) if rewards else 0.0
        completion = [len(c.completion_ids) for r in ok for c in r.calls]
        clipped = sum(c.finish_reason == "length" for r in ok for c in r.calls)
        offered = [c for r in ok for c in r.calls if c.tools]
        invalid = sum(invalid_tool_call(c.content, c.tool_calls, c.tools) for c in offered)
        # Mean surprisal of the sampled tokens: an estimate of the sampling policy's entropy
        # that exists even for steps the trainer skips (every group's rewards equal).
        sampled = [-lp for r in ok for c in r.calls if c.temperature > 0 for lp in c.logprobs]
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
            "episode/late_calls": float(sum(r.late_calls for r in self.rollouts)),
            "episode/aborted_calls": float(sum(r.aborted_calls for r in self.rollouts)),
            "response_length/mean": sum(completion) / len(completion) if completion else 0.0,
            "response_length/max": float(max(completion, default=0)),
            "response_length/clip_ratio": clipped / len(completion) if completion else 0.0,
            "explore/invalid_tool_call_rate": invalid / len(offered) if offered else 0.0,
            "entropy/sampled": sum(sampled) / len(sampled) if sampled else 0.0,
            "time/explore": self.seconds,
        }
        out.update(workflow_metrics(ok))
        out.update(self.trajectory.metrics())
        out.update(self.runtime)
        if self.loop is not None:
            out.update(self.loop.metrics())
        return out


def workflow_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """`workflow/<name>`: the mean of each metric the workflow's `Reward(metrics=...)` gave, over
    the episodes that gave it (finite numbers only).

    Example:
        >>> rows = [Rollout("r1", "a", {}, [], 0.0, metrics={"searches": 2.0}),
        ...         Rollout("r2", "b", {}, [], 1.0, metrics={"searches": 1.0, "hedged": 1.0})]
        >>> workflow_metrics(rows)
        {'workflow/hedged': 1.0, 'workflow/searches': 1.5}
    """
    values: dict[str, list[float]] = {}
    for rollout in rollouts:
        for name, value in rollout.metrics.items():
            if isinstance(value, int | float) and math.isfinite(value):
                values.setdefault(name, []).append(float(value))
    return {f"workflow/{k}": sum(v) / len(v) for k, v in sorted(values.items())}


def stratum_metrics(rollouts: Sequence[Rollout], field: str) -> dict[str, float]:
    """`reward/by_<field>/<value>`: the mean reward of the finished episodes of each value of the
    task field `field` (e.g. a question type), so a validation metric can leave out a stratum.

    Example:
        >>> rows = [Rollout("r1", "a", {"type": "x"}, [], 1.0),
        ...         Rollout("r2", "b", {"type": "y"}, [], 0.0),
        ...         Rollout("r3", "c", {"type": "x"}, [], 0.5)]
        >>> stratum_metrics(rows, "type")
        {'reward/by_type/x': 0.75, 'reward/by_type/y': 0.0}
    """
    rewards: dict[str, list[float]] = {}
    for rollout in rollouts:
        if rollout.ok and field in rollout.task:
            rewards.setdefault(str(rollout.task[field]), []).append(rollout.reward)
    return {f"reward/by_{field}/{k}": sum(v) / len(v) for k, v in sorted(rewards.items())}


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
        self.runner = runner
        """Where attempts run; None: as asyncio tasks of this process."""
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        # Episodes share keep-alive connections to the gateway, through several small pools:
        # httpx's pool scans all its waiting requests for every connection event, so one pool of
        # 1,000 concurrent episodes stalled the event loop for minutes (quadratic).
        shards = max(1, min(POOL_SHARDS, settings.max_concurrency // POOL_SIZE))
        self._pools = [
            httpx.AsyncClient(
                timeout=httpx.Timeout(3600.0, connect=60.0),
                limits=httpx.Limits(max_connections=POOL_SIZE * 2),
            )
            for _ in range(shards)
        ]
        self._episodes_started = 0
        self._warned_no_calls = False
        self._unseen_agents = UnseenAgentWarning(settings.agents)
        self._stragglers: set[asyncio.Task[Any]] = set()
        self._closures: dict[str, RolloutClosure] = {}
        self.loop_monitor = LoopMonitor()
        """Watches the event loop the episodes share (when they run here); the trainer loop
        pauses it around work of its own in this process."""

    async def close(self) -> None:
        """Cancel episodes left behind at their deadline (bounded wait), close the HTTP pool."""
        stragglers = set(self._stragglers)
        for episode in stragglers:
            episode.cancel()
        if stragglers:
            await asyncio.wait(stragglers, timeout=CANCEL_GRACE)
        if self.runner is not None:
            await self.runner.close()
        for pool in self._pools:
            await pool.aclose()

    def _model(self, scope: RolloutScope) -> OpenAIChatModel:
        parameters = OpenAIChatModel.Parameters(max_tokens=self.settings.max_tokens)
        return rollout_model(
            scope,
            self.gateway.engine.model_name,
            stream=self.settings.model_stream,
            parameters=parameters,
        )

    async def _bounded(self, episode: asyncio.Task[Any], rollout_id: str) -> Any:
        """The episode's result, or `EpisodeTimeout` at the deadline (the rollout closed first)."""
        try:
            done, _ = await asyncio.wait({episode}, timeout=self.settings.episode_timeout)
        except asyncio.CancelledError:  # the batch is cancelled (e.g. the run is stopping)
            await self._abandon(episode, rollout_id, "cancelled")
            raise
        if not done:
            await self._abandon(episode, rollout_id, "timeout")
            raise EpisodeTimeout(
                f"the episode exceeded episode_timeout={self.settings.episode_timeout}s"
            )
        return episode.result()

    async def _abandon(self, episode: asyncio.Task[Any], rollout_id: str, reason: str) -> None:
        # Close before cancelling: an app that swallows the cancellation then finds the model
        # refusing its calls, instead of starting new ones.
        self._closures[rollout_id] = await self.gateway.close_rollout(rollout_id, reason=reason)
        episode.cancel()
        done, _ = await asyncio.wait({episode}, timeout=CANCEL_GRACE)
        if not done:
            logger.warning(
                "episode %s ignored its cancellation for %.0fs; leaving it behind (it can make "
                "no more model calls)",
                rollout_id,
                CANCEL_GRACE,
            )
            self._stragglers.add(episode)
            episode.add_done_callback(self._stragglers.discard)

    async def _close(self, rollout_id: str, status: RolloutStatus) -> RolloutClosure:
        return await self.gateway.close_rollout(rollout_id, reason=str(status))

    async def _attempt(self, task: Task, scope: RolloutScope) -> tuple[Reward, RolloutClosure]:
        started = time.monotonic()
        with rollout_scope(scope):
            model = self._model(scope)
            # The task copies the context, so the app's own tasks stay in this rollout too.
            episode: asyncio.Task[Any] = asyncio.ensure_future(
                guarded(self.workflow, copy.deepcopy(task.data), model)
            )
        episode.add_done_callback(_retrieve)
        result = await self._bounded(episode, scope.rollout_id)
        closure = await self.gateway.close_rollout(
            scope.rollout_id, reason="finished", grace=self.settings.late_call_grace
        )
        if closure.late_calls:
            logger.debug("episode %s returned with calls in flight: %s", scope.rollout_id, closure)
        if self.workflow.judge is not None:
            # The judge shares the episode's deadline: a hanging judge times out like an episode.
            left = self.settings.episode_timeout - (time.monotonic() - started)
            with rollout_scope(None):  # the judge's own model calls are not the policy's
                try:
                    judged = await asyncio.wait_for(
                        self.workflow.judge(copy.deepcopy(task.data), result), max(left, 0.0)
                    )
                except TimeoutError as exc:
                    raise EpisodeTimeout(
                        f"the episode and its judge exceeded episode_timeout="
                        f"{self.settings.episode_timeout}s (the judge did not finish)"
                    ) from exc
            return as_reward(judged, "judge"), closure
        return as_reward(result, f"workflow `{self.workflow.name}`"), closure

    async def _remote_attempt(
        self, runner: EpisodeRunner, task: Task, scope: RolloutScope
    ) -> tuple[EpisodeOutcome, RolloutClosure]:
        """One attempt in a runner process; at the deadline the rollout is closed here (its calls
        are refused) while the runner cancels the episode (or is replaced if it cannot)."""
        remote = asyncio.ensure_future(
            runner.run(dict(task.data), scope, self.settings.episode_timeout)
        )
        try:
            done, _ = await asyncio.wait({remote}, timeout=self.settings.episode_timeout)
            if not done:
                self._closures[scope.rollout_id] = await self.gateway.close_rollout(
                    scope.rollout_id, reason="timeout"
                )
            outcome = await remote
        except asyncio.CancelledError:
            remote.cancel()
            await self.gateway.close_rollout(scope.rollout_id, reason="cancelled")
            raise
        closure = await self.gateway.close_rollout(
            scope.rollout_id, reason="finished", grace=self.settings.late_call_grace
        )
        return outcome, closure

    async def run_episode(self, task: Task, rollout_id: str | None = None) -> Rollout:
        """Run one episode (with retries); never raises for a failing episode."""
        rollout_id = rollout_id or uuid.uuid4().hex
        started = time.time()
        attempts = self.settings.max_retries + 1
        status, error, runner = RolloutStatus.FAILED, "", None
        late = aborted = 0
        self._episodes_started += 1
        for attempt in range(attempts):
            attempt_id = rollout_id if attempt == 0 else f"{rollout_id}.retry{attempt}"
            self.gateway.reopen_rollout(attempt_id)
            scope = RolloutScope(
                rollout_id=attempt_id,
                base_url=self.gateway.rollout_base_url(attempt_id),
                api_key=self.gateway.api_key or "no-key",
                http_client=self._pools[self._episodes_started % len(self._pools)],
            )
            try:
                async with self._limit:
                    if self.runner is None:
                        reward, closure = await self._attempt(task, scope)
                        outcome = EpisodeOutcome(reward, f"local/{os.getpid()}")
                    else:
                        outcome, closure = await self._remote_attempt(self.runner, task, scope)
                        reward = outcome.reward
                runner = outcome.runner
                calls = await self.gateway.recorder.take(attempt_id, wait_timeout=0)
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
                    step_rewards=[*scope.step_rewards, *outcome.step_rewards],
                    step_states=[*scope.step_states, *outcome.step_states],
                    metrics=dict(reward.metrics),
                    started_at=started,
                    finished_at=time.time(),
                    attempts=attempt + 1,
                    late_calls=closure.late_calls,
                    aborted_calls=closure.aborted_calls,
                    runner=runner,
                )
            except EpisodeTimeout as exc:
                status, error = RolloutStatus.TIMEOUT, str(exc)
                runner = getattr(exc, "runner", None)
            except (WorkflowReturnError, EpisodeFailed) as exc:
                status, error = RolloutStatus.FAILED, str(exc)
                runner = getattr(exc, "runner", None)
            except Exception as exc:
                status, error = RolloutStatus.FAILED, _error_text(exc)
            finally:
                await scope.aclose()
            ended = self._closures.pop(attempt_id, None)
            if ended is None:  # raised by itself: close it now (it may have left calls running)
                ended = await self._close(attempt_id, status)
            late, aborted = ended.late_calls, ended.aborted_calls
            calls = await self.gateway.recorder.take(attempt_id, wait_timeout=0)
            overflow = self.gateway.recorder.pop_overflow(attempt_id)
            if overflow is not None and status is RolloutStatus.FAILED:
                rollout = self._overflowed(task, attempt_id, calls, overflow, started, attempt + 1)
                rollout.late_calls, rollout.aborted_calls = late, aborted
                return rollout
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
            late_calls=late,
            aborted_calls=aborted,
            runner=runner,
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
        if self.runner is None:  # the episodes share this event loop: watch it
            async with self.loop_monitor.watching() as loop:
                rollouts = list(await asyncio.gather(*jobs))
        else:  # each runner process watches its own
            rollouts = list(await asyncio.gather(*jobs))
            loop = self.runner.take_loop()
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
                agents=self.settings.agents,
            )
            samples.extend(built)
            stats.merge(built_stats)
        self._unseen_agents.check(c.agent_name for r in rollouts if r.ok for c in r.calls)
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
            runtime=self.runner.take_metrics() if self.runner is not None else {},
            loop=loop,
        )


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark an episode's exception as seen (abandoned episodes otherwise log it at exit)."""
    if not task.cancelled():
        task.exception()
