"""Choosing which agents of a multi-agent app train (`explorer.agents`): untrained agents are still
served by the policy and recorded, but give no samples; an agent's context-compression calls are
tagged `<name>/compress` and train only when asked."""

from __future__ import annotations

import json
import logging

import pytest
from agentscope.agent import Agent, ContextConfig, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel

import agentscope_rft
from agentscope_rft.explorer.agents import AgentsConfig
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine
from tests.integration.test_multi_agent_shapes import _check, _reply, actor_critic


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine(_reply)


async def test_a_skipped_agent_is_served_and_recorded_but_gives_no_sample(engine):
    report = await agentscope_rft.check_workflow(
        actor_critic,
        {"id": "t"},
        engine=engine,
        timeout=60,
        show=False,
        agents=AgentsConfig(skip=["critic"]),
    )
    assert report.rollout.ok, report.rollout.error
    # the critic still talked to the policy: its calls are in the episode
    assert sum(c.agent_name == "critic" for c in report.rollout.calls) == 3
    assert sorted(s.agent_name for s in report.samples) == ["actor", "judge"]
    assert report.stats.untrained_calls == 3
    rendered = report.render()
    assert "agent critic: 3 call(s), not trained: in explorer.agents.skip" in rendered
    assert "agent actor: 3 call(s), trains (1 sample(s))" in rendered


async def test_only_the_named_agents_train_and_groups_count_them_alone(engine, caplog):
    async with Gateway(engine) as gateway:
        settings = EpisodeSettings(max_retries=0, agents=AgentsConfig(train=["actor", "judje"]))
        explorer = Explorer(agentscope_rft.workflow(actor_critic), gateway, settings)
        with caplog.at_level(logging.WARNING):
            result = await explorer.explore(
                load_tasks([{"id": "a"}, {"id": "b"}]), group_size=2, batch_id="s"
            )
            await explorer.explore(load_tasks([{"id": "c"}]), group_size=1, batch_id="s2")
        await explorer.close()
    assert all(r.ok for r in result.rollouts)
    assert {s.agent_name for s in result.samples} == {"actor"}
    assert len(result.samples) == 4  # one per episode
    metrics = result.metrics()
    assert metrics["trajectory/samples/actor"] == 4.0
    assert metrics["trajectory/samples/critic"] == metrics["trajectory/samples/judge"] == 0.0
    assert metrics["trajectory/untrained_calls"] == 4 * (3 + 1)
    assert metrics["explore/calls_per_episode"] == 7.0  # every call is still recorded
    # a misspelt name warns once, with the agents it could have meant
    warnings = [r.getMessage() for r in caplog.records if "explorer.agents names" in r.message]
    assert len(warnings) == 1
    assert "'judje'" in warnings[0] and "agents seen: actor, critic, judge" in warnings[0]


def _compressing_reply(messages: list[dict], tools: list[dict] | None) -> str:
    """Answers a compression request with a summary (the structured-output tool it is given)."""
    if "continuation summary" in str(messages[-1]["content"]) and tools:
        fields = tools[0]["function"]["parameters"]["properties"]
        arguments = {name: f"the {name}" for name in fields}
        return _tool_call(tools[0]["function"]["name"], arguments)
    return _reply(messages, tools)


def _tool_call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def compressing_solver(task, model):
    """A solver whose small context window makes AgentScope compress its memory mid-episode."""
    small = OpenAIChatModel(  # the app's own model: redirected to the episode's endpoint
        credential=OpenAICredential(api_key="k", base_url="http://unused.invalid/v1"),
        model="gpt-4o-mini",
        stream=False,
        context_size=200,
    )
    solver = Agent(
        name="solver",
        system_prompt="SOLVER: do your part.",
        model=small,
        injection_config=InjectionConfig(inject_runtime_state=False),
        context_config=ContextConfig(trigger_ratio=0.5, reserve_ratio=0.1),
    )
    for k in range(4):
        await solver.reply(UserMsg(name="user", content=f"step {k}: " + "details " * 20))
    agentscope_rft.emit_reward(0.5)  # the solver's latest turn, not its summary
    return 1.0


async def test_compression_calls_are_tagged_and_train_only_when_asked():
    engine = ScriptedEngine(_compressing_reply)
    report = await _check(compressing_solver, engine)
    assert report.rollout.ok, report.rollout.error
    names = [c.agent_name for c in report.rollout.calls]
    assert "solver/compress" in names, names
    summary = next(c for c in report.rollout.calls if c.agent_name == "solver/compress")
    assert "continuation summary" in str(summary.messages[-1]["content"])
    # by default the summaries are recorded but not trained; the solver's own turns are
    assert {s.agent_name for s in report.samples} == {"solver"}
    assert "agent solver/compress: " in report.render()
    assert "not trained: a compress helper call" in report.render()
    solver_calls = names.count("solver")
    assert sum(s.num_calls for s in report.samples) == solver_calls
    # the emitted reward went to the solver's last turn
    last = report.samples[-1]
    assert last.token_rewards is not None and sum(last.token_rewards) == 0.5

    asked = await agentscope_rft.check_workflow(
        compressing_solver,
        {"id": "t"},
        engine=engine,
        timeout=60,
        show=False,
        agents=AgentsConfig(helpers=["compress"]),
    )
    assert {s.agent_name for s in asked.samples} == {"solver", "solver/compress"}
    skipped = await agentscope_rft.check_workflow(
        compressing_solver,
        {"id": "t"},
        engine=engine,
        timeout=60,
        show=False,
        agents=AgentsConfig(helpers=["compress"], skip=["solver"]),
    )
    assert skipped.samples == []  # an agent that does not train gives no summary samples either
    assert any("no agent of this episode trains" in w for w in skipped.warnings)
