"""Demonstrations recorded by playing an app with a scripted policy: an SFT warm start.

A small model that never succeeds gives RL nothing to reinforce (docs/workflows.md, "A first
signal on a small model"). A script that can solve some training tasks (an oracle reading the
task's solution, a rule-based player) plays them through the real app, the real gateway and the
real environment, with only the model replaced by the script; every won episode becomes chat-JSONL
lines (`{"messages": [...], "tools": [...]}`): exactly what the agent showed the model, and the
script's replies as the assistant turns. `offline.path` + `offline.warmup_steps` train on them
before the run explores.

Example:
    >>> summary = asyncio.run(record_demos("app.py:run", tasks, reply, "d.jsonl"))  # doctest: +SKIP
    >>> summary["won"], summary["conversations"]  # doctest: +SKIP
    (180, 180)
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agentscope_rft.api import Workflow, WorkflowFn, load_workflow
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import Task
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.types import Rollout

T = TypeVar("T")
Reply = Callable[[list[dict[str, Any]], Any], str]
"""The scripted policy: `(messages, tools) -> reply text` (tool calls as `<tool_call>` blocks)."""


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message (a string, or OpenAI content blocks joined).

    Example:
        >>> message_text({"role": "user", "content": [{"type": "text", "text": "Hi"}]})
        'Hi'
    """
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(block.get("text", "")) for block in content if isinstance(block, dict))
    return "" if content is None else str(content)


def episode_turns(
    messages: Sequence[Mapping[str, Any]], by_question: Mapping[str, T]
) -> tuple[T, list[str]] | None:
    """The episode's task and its tool results so far, for a scripted reply: the task is the one
    whose question is the last user turn found in `by_question` (worked examples in the agent's
    memory come before it), the results are the `tool` turns after that question. None when no
    user turn is one of the questions.

    Example:
        >>> turns = [{"role": "user", "content": "Q?"}, {"role": "tool", "content": "42"}]
        >>> episode_turns(turns, {"Q?": "task"})
        ('task', ['42'])
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "user" and message_text(message).strip() in by_question:
            task = by_question[message_text(message).strip()]
            later = messages[index + 1 :]
            return task, [message_text(m) for m in later if m.get("role") == "tool"]
    return None


def conversations(
    requests: Sequence[Any], reply: Reply
) -> list[tuple[list[dict[str, Any]], list[Any] | None]]:
    """The distinct conversations of one episode's calls, each ending with the script's reply,
    with the tools the call offered.

    Full history: every call extends the one before, so the episode is one conversation (its last
    call plus the reply). A sliding window starts a fresh prompt each turn: each call is its own.
    """
    out: list[tuple[list[dict[str, Any]], list[Any] | None]] = []
    for i, request in enumerate(requests):
        messages = [
            *request.messages,
            {"role": "assistant", "content": reply(request.messages, request.tools)},
        ]
        following = requests[i + 1].messages if i + 1 < len(requests) else None
        if (
            following is not None
            and len(following) > len(request.messages)
            and following[: len(request.messages)] == request.messages
        ):
            continue  # the next call carries this turn
        out.append((messages, request.tools or None))
    return out


async def play(
    workflow: str | Workflow | WorkflowFn,
    tasks: Sequence[Task],
    reply: Reply,
    *,
    concurrency: int = 4,
    max_tokens: int | None = None,
    runtime_state: str = "keep",
    before_each: Callable[[Task], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Rollout], dict[str, list[Any]]]:
    """Play `tasks` through `workflow` with `reply` as the model (real gateway, greedy calls);
    returns the rollouts and each rollout's recorded calls, in call order.

    `max_tokens` caps every reply as the gateway caps the policy's (a longer reply is cut there,
    as the policy's would be); `runtime_state` is the run's `gateway.runtime_state` (the
    demonstrations then show the prompts the policy will see); `before_each(task)` runs before
    each episode (the episodes then run one at a time); `progress(done, total)` after each.
    """
    from agentscope_rft.testing import ScriptedEngine

    app = load_workflow(workflow)
    engine = ScriptedEngine(reply)
    await engine.start()
    greedy: dict[str, dict[str, Any]] = {"": {"temperature": 0.0}}
    if max_tokens is not None:
        greedy[""]["max_tokens"] = max_tokens
    done = 0
    try:
        async with Gateway(
            engine, sampling_overrides=greedy, runtime_state=runtime_state
        ) as gateway:
            settings = EpisodeSettings(
                max_concurrency=concurrency, max_retries=0, episode_timeout=3600
            )
            explorer = Explorer(app, gateway, settings)

            async def one(task: Task) -> Rollout:
                nonlocal done
                rollout = await explorer.run_episode(task)
                done += 1
                if progress is not None:
                    progress(done, len(tasks))
                return rollout

            if before_each is None:
                rollouts = list(await asyncio.gather(*(one(t) for t in tasks)))
            else:
                rollouts = []
                for task in tasks:
                    before_each(task)
                    rollouts.append(await one(task))
            await explorer.close()
    finally:
        await engine.close()
    calls: dict[str, list[Any]] = {}
    for request in engine.requests:  # in call order
        if request.rollout_id is not None:
            calls.setdefault(request.rollout_id, []).append(request)
    return rollouts, calls


def write_demos(
    rollouts: Sequence[Rollout],
    calls: dict[str, list[Any]],
    reply: Reply,
    out: str | Path,
) -> int:
    """Write the won episodes' conversations to `out` (chat JSONL, replaced atomically); returns
    how many lines it wrote."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    written = 0
    with tmp.open("w") as handle:
        for rollout in rollouts:
            if not rollout.success:
                continue
            for messages, tools in conversations(calls.get(rollout.rollout_id, []), reply):
                record: dict[str, Any] = {"id": rollout.task_id, "messages": messages}
                if tools:
                    record["tools"] = tools
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
    os.replace(tmp, out)
    return written


async def record_demos(
    workflow: str | Workflow | WorkflowFn,
    tasks: Sequence[Task],
    reply: Reply,
    out: str | Path,
    *,
    concurrency: int = 4,
    max_tokens: int | None = None,
    runtime_state: str = "keep",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Play `tasks` with the script and write its won episodes to `out`; returns a summary."""
    started = time.perf_counter()
    rollouts, calls = await play(
        workflow,
        tasks,
        reply,
        concurrency=concurrency,
        max_tokens=max_tokens,
        runtime_state=runtime_state,
        progress=progress,
    )
    written = write_demos(rollouts, calls, reply, out)
    won = [r for r in rollouts if r.success]
    return {
        "tasks": len(tasks),
        "won": len(won),
        "conversations": written,
        "calls_per_demo": sum(len(r.calls) for r in won) / len(won) if won else 0.0,
        "failed": sum(not r.ok for r in rollouts),
        "seconds": round(time.perf_counter() - started, 1),
        "out": str(out),
    }
