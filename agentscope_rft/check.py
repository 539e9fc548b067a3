"""`check_workflow`: run one episode of an app and show what training would capture."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from agentscope_rft.api import Workflow, WorkflowFn, load_workflow
from agentscope_rft.engines.base import Engine
from agentscope_rft.explorer.agents import AgentsConfig, agent_of, display_name
from agentscope_rft.explorer.diagnosis import TOOL_MARKUP, Finding, diagnose
from agentscope_rft.explorer.explorer import (
    EpisodeSettings,
    Explorer,
    default_max_tokens_per_call,
)
from agentscope_rft.explorer.tasks import TaskSetError, load_tasks
from agentscope_rft.explorer.trajectory import TrajectoryStats, build_samples
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.types import Rollout, Sample


@dataclass
class CheckReport:
    """What one episode produced: the rollout, its samples and how they were built."""

    rollout: Rollout
    samples: list[Sample]
    stats: TrajectoryStats
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    """The selection of agents that train it was built with."""

    def agent_lines(self) -> list[str]:
        """One line per agent of the episode: its calls, and whether (or why not) it trains."""
        calls = Counter(call.agent_name for call in self.rollout.calls)  # in call order
        samples = Counter(s.agent_name for s in self.samples)
        lines = []
        for agent, count in calls.items():
            trains = self.agents.trains(agent)
            verdict = (
                f"trains ({samples[agent]} sample(s))"
                if trains
                else f"not trained: {self.agents.why_not(agent)}"
            )
            lines.append(f"  agent {display_name(agent)}: {count} call(s), {verdict}")
        return lines

    @property
    def findings(self) -> list[Finding]:
        """What would make the app unlearnable, seen in this episode (see `explorer.diagnosis`:
        no tool calls, echoed runtime state, the token cap; one episode has no groups)."""
        return diagnose([self.rollout], groups=False) if self.rollout.ok else []

    @property
    def warnings(self) -> list[str]:
        out = []
        if not self.rollout.ok:
            out.append(f"the episode failed ({self.rollout.status}); nothing would be trained")
        elif not self.rollout.calls:
            out.append(
                "no model call reached the trainable endpoint: use the `model` argument or an "
                "AgentScope OpenAIChatModel (other clients are not redirected)"
            )
        seen = {agent_of(c.agent_name) for c in self.rollout.calls}
        unseen = [n for n in self.agents.names if n not in seen]
        if self.rollout.calls and unseen:
            out.append(
                f"explorer.agents names {', '.join(map(repr, unseen))}, which made no call in "
                f"this episode (agents: {', '.join(sorted(seen))})"
            )
        if self.rollout.ok and self.rollout.calls and not self.samples:
            out.append("no agent of this episode trains (explorer.agents): it gives no sample")
        thought = any(c.reasoning for c in self.rollout.calls)
        for reason, count in self.stats.breaks.items():
            why = ""
            if reason == "completion_retokenized" and thought:
                why = (
                    " (expected for a reasoning model whose history drops its earlier thinking: "
                    "engine.reuse_prompt_tokens keeps the sampled thinking in later prompts)"
                )
            out.append(
                f"{count} call(s) did not continue the previous one ({reason}); they train as "
                f"separate samples{why}"
            )
        findings = self.findings
        malformed = [c for c in self.rollout.calls if c.content and TOOL_MARKUP.search(c.content)]
        if malformed and not any(f.code == "no_tool_calls" for f in findings):
            out.append(f"{len(malformed)} call(s) wrote tool-call markup that did not parse")
        out.extend(f.message for f in findings)
        return out

    def render(self) -> str:
        r = self.rollout
        lines = [
            f"episode {r.rollout_id}: status {r.status}, reward {r.reward:g}, "
            f"success {r.success}, {len(r.calls)} model call(s)"
        ]
        if r.error:
            lines.append(textwrap.indent(r.error.strip(), "  | "))
        lines.extend(self.agent_lines())
        for i, call in enumerate(r.calls):
            tools = ", ".join(f"{t.name}({t.arguments})" for t in call.tool_calls) or "-"
            preview = (call.content or "").replace("\n", " ")[:100]
            thinking = ""
            if call.reasoning:
                thinking = f"; thinking: {call.reasoning.replace(chr(10), ' ')[:100]!r}"
            lines.append(
                f"  call {i} [{call.agent_name or '-'}] prompt {len(call.prompt_ids)} tokens "
                f"({call.prompt_reused_tokens} reused), completion {len(call.completion_ids)}, "
                f"{call.finish_reason}; tools: {tools}{thinking}; text: {preview!r}"
            )
        for s in self.samples:
            lines.append(
                f"  sample {s.sample_id}: {len(s.token_ids)} tokens, {s.num_trained_tokens} "
                f"trained, {s.num_calls} call(s), reward {s.reward:g}"
            )
        lines.extend(f"  warning: {w}" for w in self.warnings)
        return "\n".join(lines)


async def check_workflow(
    fn: Workflow | WorkflowFn | str,
    task: Mapping[str, Any],
    *,
    model: str = "smollm2-135m-instruct",
    engine: Engine | None = None,
    timeout: float = 300.0,
    runtime_state: str = "keep",
    show: bool = True,
    agents: AgentsConfig | None = None,
) -> CheckReport:
    """Run one episode with the embedded model (or `engine`) and report what was captured.

    The episode runs as in training: bounded by `timeout` (its rollout is closed at the deadline,
    whatever the app does with cancellation) and with the default per-call token limit.
    `runtime_state` is the config's `gateway.runtime_state` (`keep`, `freeze` or `drop`). The
    report's warnings include the diagnosis of the episode (`CheckReport.findings`).
    `agents` is the config's `explorer.agents` (which agents train); the report says, per agent,
    whether its calls would train.

    Raises:
        TaskSetError: `task` is not one task as a dict.

    Example:
        >>> task = {"id": "t1", "question": "2+2?"}
        >>> report = asyncio.run(check_workflow(run, task))  # doctest: +SKIP
        >>> report.samples[0].num_trained_tokens  # doctest: +SKIP
        17
    """
    if not isinstance(task, Mapping):
        raise TaskSetError(
            f"check_workflow's task is {type(task).__name__} {task!r:.80}: pass one task as the "
            'dict your workflow gets, e.g. {"id": "t1", "question": "2+3?"} (a task file\'s '
            "first row: `load_tasks(path)[0].data`, from agentscope_rft.explorer.tasks)"
        )
    workflow = load_workflow(fn) if not isinstance(fn, Workflow) else fn
    own_engine = engine is None
    if engine is None:
        from agentscope_rft.engines.embedded import EmbeddedEngine

        engine = EmbeddedEngine(model)
    await engine.start()
    try:
        limit = default_max_tokens_per_call(engine.max_model_len)
        async with Gateway(engine, max_tokens_limit=limit, runtime_state=runtime_state) as gateway:
            explorer = Explorer(
                workflow, gateway, EpisodeSettings(episode_timeout=timeout, max_retries=0)
            )
            try:
                [loaded] = load_tasks([task])
                async with explorer.loop_monitor.watching():  # warns if the app blocks it
                    rollout = await explorer.run_episode(loaded, "check")
            finally:
                await explorer.close()
    finally:
        if own_engine:
            await engine.close()
    agents = agents or AgentsConfig()
    samples, stats = (
        build_samples(rollout, agents=agents) if rollout.ok else ([], TrajectoryStats())
    )
    report = CheckReport(rollout=rollout, samples=samples, stats=stats, agents=agents)
    if show:
        Console().print(report.render(), markup=False, highlight=False)
    return report
