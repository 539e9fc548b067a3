"""The public API for agent developers: mark the function that runs one episode of the app.

    @agentscope_rft.workflow
    async def run(task: dict, model) -> float:
        agent = Agent(name="solver", system_prompt="...", model=model, toolkit=...)
        reply = await agent.reply(UserMsg(name="user", content=task["question"]))
        return float(task["answer"] in reply.get_text_content())

`model` is an AgentScope `OpenAIChatModel` bound to the episode's trainable endpoint. An app that
builds its own `OpenAIChatModel` trains too, unchanged: inside an episode its calls are redirected
(see `agentscope_rft.integration.agentscope`). `emit_reward` records rewards during the episode;
a separate judge can score the episode's response instead of the workflow returning a reward.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentscope_rft.types import Reward, StepReward, StepState, plain_scalar

WorkflowFn = Callable[[dict[str, Any], Any], Awaitable[Any]]
JudgeFn = Callable[[dict[str, Any], Any], Awaitable[float | Reward]]

_SIGNATURE_HELP = "async def run(task: dict, model) -> float | Reward"


class WorkflowError(TypeError):
    """A workflow or judge that does not fit the contract (names the function and the fix)."""


def _check_callable(fn: Any, what: str, params: tuple[str, str]) -> None:
    if not callable(fn):
        raise WorkflowError(
            f"{what} is {fn!r} (a {type(fn).__name__}), not a function: point `{what}:` at an "
            f"`async def f({', '.join(params)})`"
        )
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    # An app object whose `async def __call__(self, task, model)` runs the episode counts too.
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)):
        raise WorkflowError(
            f"{what} `{name}` must be an async function: `async def {name.split('.')[-1]}"
            f"({', '.join(params)})`"
        )
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError as exc:
        raise WorkflowError(
            f"{what} `{name}` must accept two positional arguments ({', '.join(params)}); its "
            f"signature is {inspect.signature(fn)}: {exc}"
        ) from exc


@dataclass(frozen=True)
class Workflow:
    """A registered episode function (and optional judge). Calling it runs the function."""

    fn: WorkflowFn
    name: str
    judge: JudgeFn | None = None

    async def __call__(self, task: dict[str, Any], model: Any) -> Any:
        return await self.fn(task, model)


def workflow(
    fn: WorkflowFn | None = None, *, judge: JudgeFn | None = None, name: str | None = None
) -> Any:
    """Mark `async def run(task, model)` as a trainable AgentScope workflow.

    With a `judge`, the function returns its response (anything) and
    `await judge(task, response)` gives the reward; the judge runs outside the episode, so its own
    model calls (an LLM judge) are neither redirected nor trained. The episode and its judge
    share one deadline (`explorer.episode_timeout`).

    Raises:
        WorkflowError: the function or judge has the wrong shape.

    Example:
        >>> @workflow
        ... async def run(task, model):
        ...     return 1.0
        >>> run.name
        'run'
    """

    def register(f: WorkflowFn) -> Workflow:
        _check_callable(f, "workflow", ("task", "model"))
        if judge is not None:
            _check_callable(judge, "judge", ("task", "response"))
        default_name: str = getattr(f, "__name__", type(f).__name__)  # an app object: its class
        return Workflow(fn=f, name=name or default_name, judge=judge)

    return register(fn) if fn is not None else register


def emit_reward(value: float, step: int | None = None, agent: str | None = None) -> None:
    """Record a reward during the current episode.

    Args:
        value: The reward.
        step: Index of the model call (0-based, in the agent's call order) the reward belongs
            to; `None` means the agent's latest call so far. Per-step rewards become token
            rewards at the end of their call; the episode reward is what the workflow returns.
        agent: The AgentScope agent name whose call it rewards (in a multi-agent episode, e.g.
            from the workflow body after the agents ran); default: the agent whose reply is
            running, else the agent that made the latest call.

    Raises:
        RuntimeError: called outside an episode.
        ValueError: `value` is not a finite real number, or `agent` names an agent that has made
            no model call in the episode and `step` is not given (the episode fails with it).

    Example:
        >>> emit_reward(0.5)  # doctest: +SKIP
        >>> emit_reward(1.0, agent="critic")  # the critic's latest call  # doctest: +SKIP
    """
    value = plain_scalar(value)  # numpy's bool, a 0-d array or tensor
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(
            f"emit_reward({value!r:.80}): a step reward must be a finite number (a NaN would "
            "make the training step's gradient NaN)"
        )
    # Imported here: checking a workflow's path and signature must not wait for AgentScope.
    from agentscope_rft.integration.agentscope import current_agent, current_scope

    scope = current_scope()
    if scope is None:
        raise RuntimeError("emit_reward() was called outside an episode run by agentscope-rft")
    if agent is not None and step is None and not scope.calls_made.get(agent):
        called = ", ".join(repr(a) for a in scope.calls_made if a is not None) or "none yet"
        raise ValueError(
            f"emit_reward({value!r:.80}, agent={agent!r}): that agent has made no model call in "
            f"this episode, so it has no call to reward (agents with calls: {called}). Name the "
            "agent as its `Agent(name=...)` says, or give `step` for a call it makes later"
        )
    # Outside any agent's reply (e.g. in the workflow body), the reward is the last-called agent's.
    agent = agent or current_agent() or scope.last_agent
    if step is None:
        step = max(scope.calls_made.get(agent, 0) - 1, 0)
    scope.step_rewards.append(StepReward(value=float(value), call_index=step, agent_name=agent))


def emit_state(key: str, agent: str | None = None) -> None:
    """Record the environment state the agent's *next* model call acts in.

    Calls of one group's episodes made in the same state (equal `key`) form a step group, which
    step-level advantages compare against each other (GiGPO's anchor states, `advantage: gigpo`).
    Use a key that identifies the state, e.g. the observation text plus what the agent can do.

    Args:
        key: The state, as text.
        agent: The AgentScope agent name whose next call it is; default: the agent whose reply is
            running, else the one that was called last, else the episode's only agent.

    Raises:
        RuntimeError: called outside an episode.

    Example:
        >>> emit_state(observation + "|" + "|".join(admissible))  # doctest: +SKIP
        >>> reply = await agent.reply(UserMsg(name="user", content=observation))  # doctest: +SKIP
    """
    from agentscope_rft.integration.agentscope import current_agent, current_scope

    scope = current_scope()
    if scope is None:
        raise RuntimeError("emit_state() was called outside an episode run by agentscope-rft")
    agent = agent or current_agent() or scope.last_agent
    step = scope.calls_made.get(agent, 0)
    scope.step_states.append(StepState(key=str(key), call_index=step, agent_name=agent))


def import_file(path: Path) -> Any:
    """Import the Python file `path` as a module (it may import the files beside it).

    Example:
        >>> report = import_file(Path("examples/web_search/report.py"))  # doctest: +SKIP
    """
    module_name = f"_agentscope_rft_workflow_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkflowError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    # Let the file import its neighbours (e.g. `from task import ...` next to app.py), its own
    # ones even where another folder's `task` or `app` was imported first in this process.
    folder = path.parent.resolve()
    shadowed = _shadowed_neighbours(folder)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
        sys.modules.update(shadowed)
    return module


def _shadowed_neighbours(folder: Path) -> dict[str, Any]:
    """Take out of `sys.modules` (and return) the modules named like a file of `folder` but
    loaded from elsewhere, so the folder's own file is imported; they are put back after."""
    taken = {}
    for file in folder.glob("*.py"):
        loaded = sys.modules.get(file.stem)
        origin = getattr(loaded, "__file__", None)
        if loaded is not None and origin and Path(origin).resolve() != file.resolve():
            taken[file.stem] = sys.modules.pop(file.stem)
    return taken


def load_callable(spec: str, what: str = "workflow") -> Any:
    """Import `pkg.mod:name` or `path/to/file.py:name` (relative to the working directory)."""
    if ":" not in spec:
        raise WorkflowError(
            f"{what} {spec!r} must be `package.module:function` or `path/to/file.py:function`"
        )
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target).expanduser()
            if not path.is_file():
                raise WorkflowError(f"{what} file {path} does not exist (from {spec!r})")
            module = import_file(path)
        else:
            module = importlib.import_module(target)
    except WorkflowError:
        raise
    except Exception as exc:
        raise WorkflowError(
            f"{what} {spec!r} does not import: {type(exc).__name__}: {exc}{_file_hint(target, exc)}"
        ) from exc
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise WorkflowError(f"{target} has no {attr!r} (it defines: {', '.join(public[:15])})")
    return getattr(module, attr)


def _file_hint(target: str, exc: BaseException) -> str:
    """How to name a module that is a file: `agentscope-rft` (a console script) does not put the
    working directory on `sys.path` as `python -m` does, so `my_app:run` beside it is not found."""
    top = target.split(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or exc.name != top:
        return ""
    file = Path(*target.split(".")).with_suffix(".py")
    where = f" ({file} is in the working directory)" if file.is_file() else ""
    return (
        f"; a file is named by its path: `{file}:<function>`, relative to the config file's "
        f"folder{where}, or `package.module:function` of an installed package"
    )


def load_workflow(
    spec: str | Workflow | WorkflowFn, judge: str | JudgeFn | None = None
) -> Workflow:
    """Resolve a workflow from config (`pkg.mod:run`, `file.py:run`) or an object.

    A plain `async def run(task, model)` works too (the decorator is optional when loading by
    path); a judge given here overrides the decorator's.

    Example:
        >>> wf = load_workflow("examples/quickstart/app.py:run")  # doctest: +SKIP
    """
    obj = load_callable(spec) if isinstance(spec, str) else spec
    judge_fn = load_callable(judge, "judge") if isinstance(judge, str) else judge
    if isinstance(obj, Workflow):
        if judge_fn is None:
            return obj
        _check_callable(judge_fn, "judge", ("task", "response"))
        return Workflow(fn=obj.fn, name=obj.name, judge=judge_fn)
    registered: Workflow = workflow(obj, judge=judge_fn)
    return registered
