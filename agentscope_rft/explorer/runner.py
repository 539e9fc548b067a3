"""Where one attempt of an episode runs: the explorer's seam to a runtime.

The explorer owns retries, deadlines at the gateway, the gateway's records and the rollout. With
no runner it runs the workflow as an asyncio task of its own process (the local runtime); an
`EpisodeRunner` runs it elsewhere, once, against the rollout's gateway URL, and returns its reward
(the Ray runtime's runner pool, `agentscope_rft.runtime.ray`, runs it in a runner process).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentscope.model import OpenAIChatModel

from agentscope_rft.api import Workflow
from agentscope_rft.explorer.loop_monitor import LoopStats
from agentscope_rft.integration.agentscope import RolloutScope, rollout_model, rollout_scope
from agentscope_rft.types import Reward, plain_scalar


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


def _finite(value: Any) -> float | None:
    """`value` as a float when it is a finite real number (numpy scalars too), else None."""
    value = plain_scalar(value)
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    return None


def as_reward(value: Any, source: str) -> Reward:
    """What the workflow (or judge) returned, as a `Reward` of plain floats.

    Raises:
        WorkflowReturnError: neither a finite real number nor a `Reward` with a finite value and
            real-number metrics.

    Example:
        >>> as_reward(1, "workflow").value
        1.0
    """
    if not isinstance(value, Reward):
        reward = _finite(value)
        if reward is None:
            raise WorkflowReturnError(
                f"the {source} returned {type(value).__name__} {value!r:.80}; it must return a "
                "finite float or agentscope_rft.Reward (a workflow with a judge may return any "
                "response)"
            )
        return Reward(reward)
    reward = _finite(value.value)
    if reward is None:
        raise WorkflowReturnError(
            f"the {source} returned Reward(value={value.value!r:.80}); its value must be a finite "
            "float"
        )
    given = {k: plain_scalar(v) for k, v in value.metrics.items()}
    bad = {k: value.metrics[k] for k, v in given.items() if not isinstance(v, numbers.Real)}
    if bad:
        raise WorkflowReturnError(
            f"the {source} returned a Reward whose metrics {bad!r:.120} are not numbers"
        )
    metrics = {k: float(v) for k, v in given.items()}
    success = None if value.success is None else bool(plain_scalar(value.success))
    return dataclasses.replace(value, value=reward, metrics=metrics, success=success)


class WorkflowEnded(RuntimeError):
    """The workflow ended by raising what stops a program (`SystemExit`) or cancels a task
    (`asyncio.CancelledError`, with nothing cancelling it): a failed episode, not the run's end."""


async def guarded(workflow: Workflow, task: dict[str, Any], model: Any) -> Any:
    """`workflow.fn(task, model)`, where the app's own `sys.exit()` or `CancelledError` fails the
    episode instead of ending the run (asyncio lets `SystemExit` out of the event loop, and a task
    that raises `CancelledError` looks cancelled to whoever awaits it, so the whole batch was)."""
    try:
        return await workflow.fn(task, model)
    except SystemExit as exc:  # the traceback says where the app called it
        raise WorkflowEnded(
            f"the workflow `{workflow.name}` called sys.exit({exc.code!r}): end an episode by "
            "returning its reward (or raising an exception); sys.exit would stop the whole run"
        ) from exc
    except asyncio.CancelledError as exc:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # cancelled from outside: the deadline or the run stopping
        raise WorkflowEnded(
            f"the workflow `{workflow.name}` raised asyncio.CancelledError though nothing "
            "cancelled it (an AgentScope agent interrupted with `interruption_raise_cancelled_"
            "error`, or an inner task's cancellation let through): catch it in the app and return "
            "a reward"
        ) from exc


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

    def take_loop(self) -> LoopStats:
        """What the event loops running the attempts saw since the last call."""
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
        result = await asyncio.wait_for(guarded(workflow, copy.deepcopy(task), policy), timeout)
    if workflow.judge is not None:
        with rollout_scope(None):  # the judge's own model calls are not the policy's
            return as_reward(await workflow.judge(copy.deepcopy(task), result), "judge")
    return as_reward(result, f"workflow `{workflow.name}`")
