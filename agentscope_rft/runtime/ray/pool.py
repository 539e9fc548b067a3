"""The runner pool: the explorer's episodes dispatched to runner processes (Ray actors).

Each runner takes up to `episodes_per_runner` episodes at once; an episode goes to the live runner
with the fewest running. What can go wrong with a runner, and what the pool does:

- it dies (the workflow crashed it, segfaulted, was killed, its node went away): the episodes it
  was running fail with `RunnerLost` (the explorer retries them under fresh rollout ids, so
  nothing recorded under the lost attempt is trained) and a new runner takes its place;
- it stops answering (synchronous code blocking its event loop past the episode timeout): it is
  killed and replaced, the episode times out;
- its memory grows past `runner_memory_mb` (a leaking environment): it takes no new episodes and
  is replaced once the ones it runs have finished.

Every such event is counted (`runtime/runner_deaths`, `runtime/runners_stuck`,
`runtime/runners_recycled`, `runtime/runners_started`) in the step's metrics. Each runner watches
its own event loop, which its episodes share, as the local runtime watches the run's
(`explore/loop_lag_max`, `explore/loop_blocks`; a blocking app is named in the runner's log).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from agentscope_rft.config_errors import ConfigError
from agentscope_rft.explorer.loop_monitor import LoopStats
from agentscope_rft.explorer.runner import (
    EpisodeFailed,
    EpisodeOutcome,
    EpisodeTimeout,
    RunnerLost,
    WorkflowReturnError,
)
from agentscope_rft.integration.agentscope import RolloutScope
from agentscope_rft.runtime.config import RuntimeConfig
from agentscope_rft.runtime.ray.process import AttemptResult, EpisodeRunnerProcess, RunnerSpec

logger = logging.getLogger(__name__)

STUCK_GRACE_S = 10.0
"""How long past its timeout a runner may take to answer before it is considered stuck."""


def _runner_gone() -> tuple[type[BaseException], ...]:
    """Ray's errors for an actor whose process or node went away (crash, kill, OOM kill)."""
    from ray import exceptions as ex

    return (ex.RayActorError, ex.OutOfMemoryError, ex.WorkerCrashedError, ex.NodeDiedError)


def _start_failures() -> tuple[type[BaseException], ...]:
    import ray

    return (*_runner_gone(), ray.exceptions.RuntimeEnvSetupError)


@dataclass
class _Runner:
    slot: int
    actor: Any
    label: str = "?"
    active: int = 0
    retired: bool = False


class RunnerStartError(ConfigError):
    """A runner process could not start (the workflow does not import there, no resources)."""


class RayRunnerPool:
    """`runtime.runners` episode runner processes on the Ray cluster (Ray must be initialized).

    Example:
        >>> pool = RayRunnerPool(spec, config.runtime, "http://10.0.0.1:8000")  # doctest: +SKIP
        >>> await pool.start()  # doctest: +SKIP
        >>> outcome = await pool.run(task, scope, timeout=300)  # doctest: +SKIP
    """

    def __init__(
        self,
        spec: RunnerSpec,
        config: RuntimeConfig,
        gateway_url: str,
        *,
        runtime_env: dict[str, Any] | None = None,
        start_timeout: float = 300.0,
        stuck_grace: float = STUCK_GRACE_S,
    ) -> None:
        self.spec = spec
        self.config = config
        self.gateway_url = gateway_url.rstrip("/")
        self.runtime_env = runtime_env or {}
        self.start_timeout = start_timeout
        self.stuck_grace = stuck_grace
        self._runners: list[_Runner | None] = [None] * config.runners
        self._changed = asyncio.Condition()
        self._replacing: set[asyncio.Task[None]] = set()
        self._counts: Counter[str] = Counter()
        self._processes: set[str] = set()
        self._broken: BaseException | None = None
        self._loop = LoopStats()

    def _new_actor(self) -> Any:
        import ray

        actor_class = ray.remote(EpisodeRunnerProcess)
        return actor_class.options(
            num_cpus=self.config.runner_cpus,
            num_gpus=self.config.runner_gpus,
            max_concurrency=self.config.episodes_per_runner + 2,
            max_restarts=0,  # the pool replaces a dead runner itself (and counts it)
            scheduling_strategy="SPREAD" if self.config.placement == "spread" else "DEFAULT",
            runtime_env=self.runtime_env or None,
        ).remote(self.spec)

    async def _start_runner(self, slot: int) -> None:
        import ray

        actor = self._new_actor()
        try:
            info = await asyncio.wait_for(actor.info.remote(), self.start_timeout)
        except TimeoutError as exc:
            ray.kill(actor)
            raise RunnerStartError(
                f"runner {slot} did not start in {self.start_timeout:.0f}s: the cluster may lack "
                f"the resources one runner asks (runtime.runner_cpus {self.config.runner_cpus}, "
                f"runtime.runner_gpus {self.config.runner_gpus})"
            ) from exc
        except _start_failures() as exc:
            raise RunnerStartError(f"runner {slot} failed to start: {exc}") from exc
        label = f"{info['node'][:8]}/{info['pid']}"
        async with self._changed:
            self._runners[slot] = _Runner(slot, actor, label)
            self._counts["runtime/runners_started"] += 1
            self._changed.notify_all()

    async def start(self) -> None:
        """Start every runner; raises `RunnerStartError` (saying why) if one cannot start."""
        results = await asyncio.gather(
            *(self._start_runner(slot) for slot in range(self.config.runners)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]
        nodes = {r.label.split("/")[0] for r in self._runners if r is not None}
        logger.info(
            "ray runtime: %d episode runners on %d node(s), up to %d episodes each",
            self.config.runners,
            len(nodes),
            self.config.episodes_per_runner,
        )

    async def _acquire(self) -> _Runner:
        async with self._changed:
            while True:
                if self._broken is not None:
                    raise RuntimeError(f"episode runners cannot be replaced: {self._broken}")
                free = [
                    r
                    for r in self._runners
                    if r is not None
                    and not r.retired
                    and r.active < self.config.episodes_per_runner
                ]
                if free:
                    runner = min(free, key=lambda r: r.active)
                    runner.active += 1
                    return runner
                await self._changed.wait()

    async def _release(self, runner: _Runner, rss_mb: float | None = None) -> None:
        limit = self.config.runner_memory_mb
        async with self._changed:
            runner.active -= 1
            if limit is not None and rss_mb is not None and rss_mb > limit and not runner.retired:
                runner.retired = True
                self._counts["runtime/runners_recycled"] += 1
                logger.warning(
                    "runner %s uses %.0f MB (> runtime.runner_memory_mb %d): replacing it once "
                    "its episodes finish",
                    runner.label,
                    rss_mb,
                    limit,
                )
            if runner.retired and runner.active == 0 and self._runners[runner.slot] is runner:
                self._replace(runner)
            self._changed.notify_all()

    def _replace(self, runner: _Runner) -> None:
        """Kill `runner` (if alive) and start another in its slot (caller holds the lock)."""
        import ray

        if self._runners[runner.slot] is not runner:
            return  # already replaced
        self._runners[runner.slot] = None
        try:
            ray.kill(runner.actor, no_restart=True)
        except Exception:  # already gone
            logger.debug("runner %s was already gone", runner.label)

        async def restart() -> None:
            try:
                await self._start_runner(runner.slot)
            except Exception as exc:
                logger.error("could not replace episode runner %s: %s", runner.label, exc)
                async with self._changed:
                    self._broken = exc
                    self._changed.notify_all()

        task = asyncio.get_running_loop().create_task(restart())
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _lost(self, runner: _Runner, counter: str) -> None:
        async with self._changed:
            if self._runners[runner.slot] is runner:
                self._counts[counter] += 1
                self._replace(runner)
            runner.active -= 1
            self._changed.notify_all()

    async def run(
        self, task: dict[str, Any], scope: RolloutScope, timeout: float
    ) -> EpisodeOutcome:
        """Run one attempt in a runner process (see the module docstring for failures)."""
        import ray

        runner = await self._acquire()
        url = f"{self.gateway_url}/rollouts/{scope.rollout_id}/v1"
        ref = runner.actor.run.remote(task, scope.rollout_id, url, scope.api_key, timeout)
        try:
            result: AttemptResult = await asyncio.wait_for(ref, timeout + self.stuck_grace)
        except TimeoutError as exc:
            logger.warning(
                "runner %s did not answer %.0fs past the episode timeout (blocking code?): "
                "replacing it",
                runner.label,
                self.stuck_grace,
            )
            await self._lost(runner, "runtime/runners_stuck")
            raise EpisodeTimeout(
                f"the episode exceeded episode_timeout={timeout}s and its runner {runner.label} "
                "did not answer (blocking code?): the runner was replaced",
                runner.label,
            ) from exc
        except _runner_gone() as exc:
            first = self._runners[runner.slot] is runner
            await self._lost(runner, "runtime/runner_deaths")
            if first:
                logger.warning("runner %s died; replacing it", runner.label)
            raise RunnerLost(
                f"the runner process {runner.label} died during the episode (crash, segfault, "
                f"out of memory or killed); it was replaced. Ray says: {str(exc)[:600]}",
                runner.label,
            ) from exc
        except asyncio.CancelledError:
            ray.cancel(ref)
            await self._release(runner)
            raise
        self._processes.add(runner.label)
        self._loop.merge(LoopStats(result.loop_lag_max, result.loop_blocks))
        await self._release(runner, result.rss_mb)
        if result.status == "timeout":
            raise EpisodeTimeout(f"the episode exceeded episode_timeout={timeout}s", runner.label)
        if result.status == "bad_return":
            raise WorkflowReturnError(result.error)
        if result.status != "ok":
            raise EpisodeFailed(f"in runner {runner.label}:\n{result.error}", runner.label)
        return EpisodeOutcome(
            result.reward, runner.label, list(result.step_rewards), list(result.step_states)
        )

    async def settle(self) -> int:
        """Wait for runner replacements under way; returns the runners alive."""
        await asyncio.gather(*list(self._replacing), return_exceptions=True)
        return sum(r is not None for r in self._runners)

    def take_metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self._counts.items()}
        out["runtime/runners"] = float(sum(r is not None for r in self._runners))
        out["runtime/runner_processes"] = float(len(self._processes))
        for key in ("runtime/runner_deaths", "runtime/runners_stuck", "runtime/runners_recycled"):
            out.setdefault(key, 0.0)
        self._counts.clear()
        self._processes.clear()
        return out

    def take_loop(self) -> LoopStats:
        """What the runners' event loops saw since the last call (lag at its largest, blocks
        summed), as their attempts reported it."""
        loop, self._loop = self._loop, LoopStats()
        return loop

    async def close(self) -> None:
        import ray

        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        for runner in self._runners:
            if runner is not None:
                try:
                    ray.kill(runner.actor, no_restart=True)
                except Exception:
                    logger.debug("runner %s was already gone", runner.label)
        self._runners = [None] * self.config.runners
