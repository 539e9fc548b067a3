"""Where one attempt of an episode runs: the explorer's seam to a runtime.

The explorer owns retries, deadlines at the gateway, the gateway's records and the rollout. With
no runner it runs the workflow as an asyncio task of its own process (the local runtime); an
`EpisodeRunner` runs it elsewhere, once, against the rollout's gateway URL, and returns its reward
(the Ray runtime's runner pool, `agentscope_rft.runtime.ray`, runs it in a runner process).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentscope.model import OpenAIChatModel

from agentscope_rft.api import Workflow
from agentscope_rft.integration.agentscope import RolloutScope, rollout_model, rollout_scope
from agentscope_rft.types import Reward


class WorkflowReturnError(TypeError):
    """The workflow (or judge) returned something that is not a reward."""


class EpisodeFailed(RuntimeError):
    """An attempt failed in another process; the message is the whole story (remote traceback)."""

    def __init__(self, message: str, runner: str | None = None) -> None:
        super().__init__(message)
        self.runner = runner


class EpisodeTimeout(Exception):
    """The episode did not finish within `episode_timeout`."""

    def __init__(self, message: str, runner: str | None = None) -> None:
        super().__init__(message)
        self.runner = runner


class RunnerLost(EpisodeFailed):
    """The process running the episode died (crash, segfault, kill) before it finished.

    The explorer treats it as a failed attempt (retried like any other); the runtime has already
    replaced the runner.
    """


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
class ModelSettings:
    """How the model handed to the workflow is built (the same in every runner)."""

    model_name: str
    stream: bool = False
    max_tokens: int | None = None


@dataclass
class EpisodeOutcome:
    """What one finished attempt returns to the explorer."""

    reward: Reward
    runner: str | None = None
    """Where it ran: `local/<pid>` in the explorer's process, `<node>/<pid>` in a Ray runner."""
    step_rewards: list[Any] = field(default_factory=list)
    """Rewards emitted with `emit_reward` in another process (in-process ones go to the scope)."""
    step_states: list[Any] = field(default_factory=list)
    """States emitted in another process (in-process ones go to the scope)."""


class EpisodeRunner(Protocol):
    """Runs one attempt of an episode elsewhere; raises `EpisodeTimeout` past `timeout`,
    `RunnerLost` when the process running it dies, `EpisodeFailed` when the workflow raises."""

    async def run(
        self, task: dict[str, Any], scope: RolloutScope, timeout: float
    ) -> EpisodeOutcome:
        """Run the workflow on `task` with its model calls going to `scope`'s rollout."""
        ...

    def take_metrics(self) -> dict[str, float]:
        """Counters since the last call (e.g. `runtime/runner_deaths`), for the step's metrics."""
        ...

    async def close(self) -> None: ...


async def run_attempt(
    workflow: Workflow,
    task: dict[str, Any],
    scope: RolloutScope,
    model: ModelSettings,
    timeout: float,
) -> Reward:
    """Run the workflow (and its judge) once inside `scope` (in a runner process)."""
    with rollout_scope(scope):
        policy = rollout_model(
            scope,
            model.model_name,
            stream=model.stream,
            parameters=OpenAIChatModel.Parameters(max_tokens=model.max_tokens),
        )
        result = await asyncio.wait_for(workflow.fn(dict(task), policy), timeout)
    if workflow.judge is not None:
        with rollout_scope(None):  # the judge's own model calls are not the policy's
            return as_reward(await workflow.judge(dict(task), result), "judge")
    return as_reward(result, f"workflow `{workflow.name}`")
