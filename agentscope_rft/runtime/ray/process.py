"""The episode runner process: a Ray actor that runs the user's workflow against the gateway.

It loads the workflow by its config spec (the same `pkg.mod:run` or `path/app.py:run` the run
uses), and runs each attempt exactly as the local runtime does (`run_attempt`), with the model
calls going to the gateway by URL (rollout id in the path). Nothing it does can hurt the run's
process: a crash, a segfault or a kill ends only this actor, which the pool replaces.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentscope_rft.api import load_workflow
from agentscope_rft.explorer.loop_monitor import LoopMonitor, LoopStats
from agentscope_rft.explorer.runner import ModelSettings, WorkflowReturnError, run_attempt
from agentscope_rft.integration.agentscope import RolloutScope


@dataclass(frozen=True)
class RunnerSpec:
    """Everything a runner needs to run episodes (sent once, when it starts)."""

    workflow: str
    """The workflow spec with file paths made absolute."""
    judge: str | None
    model: ModelSettings
    cwd: str | None = None
    """The run's working directory (relative paths in the app resolve as they do locally); None
    with a Ray `working_dir` (Ray starts the runner inside the uploaded copy)."""
    sys_path: list[str] = field(default_factory=list)
    """Folders put in front of `sys.path` (the run's directory, the package's source root)."""


@dataclass
class AttemptResult:
    """An attempt's result as it travels back to the run's process."""

    status: str
    """`ok`, `timeout`, `bad_return` (not a reward) or `error` (the workflow raised)."""
    reward: Any = None
    step_rewards: list[Any] = field(default_factory=list)
    step_states: list[Any] = field(default_factory=list)
    error: str = ""
    rss_mb: float = 0.0
    """The runner's resident memory after the attempt (for `runtime.runner_memory_mb`)."""
    loop_lag_max: float = 0.0
    """The largest lag of the runner's event loop since its previous result (its episodes
    share that loop, as local episodes share the run's)."""
    loop_blocks: int = 0
    """Blocking stalls of that loop since its previous result (`explore/loop_blocks`)."""


def _error_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) < 4000 else "...\n" + text[-4000:]


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):  # not Linux
        import psutil

        return float(psutil.Process().memory_info().rss) / 2**20


class EpisodeRunnerProcess:
    """The runner actor's class (wrapped with `ray.remote` by the pool).

    Example:
        >>> actor = ray.remote(EpisodeRunnerProcess).remote(spec)  # doctest: +SKIP
        >>> ray.get(actor.run.remote(task, "s0.3", url, key, 60.0)).status  # doctest: +SKIP
        'ok'
    """

    def __init__(self, spec: RunnerSpec) -> None:
        for folder in reversed(spec.sys_path):
            if folder not in sys.path:
                sys.path.insert(0, folder)
        if spec.cwd is not None and os.path.isdir(spec.cwd):
            os.chdir(spec.cwd)
        self.workflow = load_workflow(spec.workflow, spec.judge)
        self.model = spec.model
        self._http: httpx.AsyncClient | None = None
        self._monitor = LoopMonitor()
        self._watching: contextlib.AbstractAsyncContextManager[LoopStats] | None = None
        self._loop_window: LoopStats | None = None

    def info(self) -> dict[str, Any]:
        """Where this runner lives."""
        import ray

        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "node": context.get_node_id(), "rss_mb": _rss_mb()}

    async def run(
        self, task: dict[str, Any], rollout_id: str, base_url: str, api_key: str, timeout: float
    ) -> AttemptResult:
        """Run one attempt; every failure of the workflow comes back as data."""
        if self._http is None:  # created on the actor's event loop
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(3600.0, connect=10.0))
        if self._loop_window is None:
            # One window for the actor's life (it ends with the process): each result reports
            # what the loop saw since the previous one, so a stall is counted once however many
            # of this runner's episodes it held up.
            self._watching = self._monitor.watching()  # kept: collected, it would end
            self._loop_window = await self._watching.__aenter__()
        result = await self._attempt(task, rollout_id, base_url, api_key, timeout)
        loop = self._monitor.take(self._loop_window)
        result.loop_lag_max, result.loop_blocks = loop.lag_max, loop.blocks
        result.rss_mb = _rss_mb()
        return result

    async def _attempt(
        self, task: dict[str, Any], rollout_id: str, base_url: str, api_key: str, timeout: float
    ) -> AttemptResult:
        scope = RolloutScope(
            rollout_id=rollout_id, base_url=base_url, api_key=api_key, http_client=self._http
        )
        try:
            reward = await run_attempt(self.workflow, task, scope, self.model, timeout)
        except TimeoutError:
            return AttemptResult("timeout")
        except WorkflowReturnError as exc:
            return AttemptResult("bad_return", error=str(exc))
        except Exception as exc:
            return AttemptResult("error", error=_error_text(exc))
        return AttemptResult("ok", reward, list(scope.step_rewards), list(scope.step_states))
