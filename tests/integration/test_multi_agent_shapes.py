"""Multi-agent AgentScope apps: each call is recorded once under its agent, each agent's turns
merge into one sample, rewards reach the agents they name, and one agent's failure fails only
its episode. A scripted engine answers by the agent's system prompt, so tool calls happen."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentscope.agent import Agent, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.pipeline import TeamMember, TeamPipeline
from agentscope.tool import FunctionTool, Toolkit
from pydantic import BaseModel

import agentscope_rft
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.integration.agentscope import rollout_scope
from agentscope_rft.testing import ScriptedEngine
from agentscope_rft.types import RolloutStatus


def _tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _role(messages: list[dict]) -> str:
    """The first word of the system prompt (a string or text blocks)."""
    content = messages[0]["content"]
    if isinstance(content, list):
        content = "".join(block.get("text", "") for block in content)
    return str(content).split(":")[0]


def _reply(messages: list[dict], tools: list[dict] | None) -> str:
    """The role is the system prompt's first word: a role with a tool calls it first, then
    answers; the others answer by their turn count."""
    role = _role(messages)
    first = messages[-1]["role"] == "user"
    if role == "LEADER" and first:
        return "\n".join(
            _tool_call("TeamAssign", member=member, prompt=f"part {k}")
            for k, member in enumerate(("adder", "writer"))
        )
    if role == "ADDER" and first:
        return _tool_call("add", a=2, b=3)
    if role == "BOSS" and first:
        return _tool_call("ask_helper", question="what is 2+3?")
    if role == "JUDGE" and first:
        return _tool_call("GenerateStructuredOutput", answer="5", confidence=3)
    turn = sum(m["role"] == "assistant" for m in messages)
    return f"{role} says {turn}."


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def _tools(*functions) -> Toolkit:
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="allowed in tests")
    return Toolkit(tools=[FunctionTool(f, permission=allow) for f in functions])


class Verdict(BaseModel):
    answer: str
    confidence: int


async def team(task, model):
    """A leader assigns to two members at once (`TeamPipeline`); one member uses a tool."""
    members = [
        TeamMember(agent=_agent("adder", "ADDER", model, toolkit=_tools(add)), description="adds"),
        TeamMember(agent=_agent("writer", "WRITER", model), description="writes"),
    ]
    pipeline = TeamPipeline(_agent("leader", "LEADER", model), members)
    async for _ in pipeline.reply_stream(UserMsg(name="user", content="add and write")):
        pass
    return 1.0


async def agent_as_tool(task, model):
    """An agent whose tool runs another agent, asked twice (the helper keeps its context)."""
    helper = _agent("helper", "HELPER", model)

    async def ask_helper(question: str) -> str:
        """Ask the helper.

        Args:
            question: The question.
        """
        reply = await helper.reply(UserMsg(name="user", content=question))
        return reply.get_text_content() or ""

    boss = _agent("boss", "BOSS", model, toolkit=_tools(ask_helper))
    await boss.reply(UserMsg(name="user", content="ask the helper"))
    await boss.reply(UserMsg(name="user", content="and now?"))
    return 1.0


async def actor_critic(task, model):
    """Three rounds of an actor and a critic, each keeping its own context; then a structured
    verdict from a judge."""
    actor, critic = _agent("actor", "ACTOR", model), _agent("critic", "CRITIC", model)
    message = UserMsg(name="user", content="propose")
    for _ in range(3):
        proposal = await actor.reply(message)
        critique = await critic.reply(UserMsg(name="actor", content=proposal.get_text_content()))
        message = UserMsg(name="critic", content=critique.get_text_content())
    judge = _agent("judge", "JUDGE", model)
    verdict = await judge.reply(UserMsg(name="user", content="verdict?"), structured_schema=Verdict)
    return float(verdict.structured_output == {"answer": "5", "confidence": 3})


SHAPES = {
    team: {"leader": 2, "adder": 2, "writer": 1},
    agent_as_tool: {"boss": 4, "helper": 2},
    actor_critic: {"actor": 3, "critic": 3, "judge": 1},
}


@pytest.mark.parametrize("app", list(SHAPES), ids=lambda app: app.__name__)
async def test_each_agent_is_recorded_once_and_trains_as_one_exact_sequence(app, engine):
    report = await _check(app, engine)
    rollout = report.rollout
    assert rollout.ok and rollout.reward == 1.0, rollout.error
    calls = rollout.calls
    # every request the engine answered is one recorded call, under the agent that made it
    assert len(calls) == len(engine.requests)
    assert {name: sum(c.agent_name == name for c in calls) for name in SHAPES[app]} == SHAPES[app]
    for call in calls:
        assert _role(call.messages).lower() == call.agent_name
    # each agent's turns reuse its sampled tokens: one sample per agent, nothing re-tokenized
    assert not report.stats.breaks
    assert sorted(s.agent_name for s in report.samples) == sorted(SHAPES[app])
    for sample in report.samples:
        mine = [c for c in calls if c.agent_name == sample.agent_name]
        assert sample.num_calls == len(mine) and sample.reward == 1.0
        for call in mine:
            sampled = call.prompt_ids + call.completion_ids
            assert sample.token_ids[: len(sampled)] == sampled
        assert sample.token_ids == mine[-1].prompt_ids + mine[-1].completion_ids
        assert sum(sample.loss_mask) == sum(len(c.completion_ids) for c in mine)


async def test_one_failing_agent_fails_only_its_episode(engine):
    async def app(task, model):
        steady = _agent("steady", "STEADY", model)

        async def fragile():
            await _agent("fragile", "FRAGILE", model).reply(UserMsg(name="user", content="go"))
            if task["id"] == "breaks":
                raise RuntimeError("the fragile agent broke")

        await asyncio.gather(steady.reply(UserMsg(name="user", content="go")), fragile())
        return 1.0

    workflow = agentscope_rft.workflow(app)
    async with Gateway(engine) as gateway:
        explorer = Explorer(workflow, gateway, EpisodeSettings(max_retries=0))
        tasks = load_tasks([{"id": "breaks"}, {"id": "holds"}])
        result = await explorer.explore(tasks, group_size=2, batch_id="b")
        await explorer.close()
    by_task: dict[str, list] = {}
    for rollout in result.rollouts:
        by_task.setdefault(rollout.task_id, []).append(rollout)
    assert [r.status for r in by_task["breaks"]] == [RolloutStatus.FAILED] * 2
    assert "the fragile agent broke" in (by_task["breaks"][0].error or "")
    assert all(r.ok for r in by_task["holds"])
    # the failed episodes train nothing; each good one gives a sample per agent
    assert sorted((s.task_id, s.agent_name) for s in result.samples) == sorted(
        [("holds", "fragile"), ("holds", "steady")] * 2
    )


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine(_reply)


def _agent(name: str, role: str, model, **kwargs) -> Agent:
    return Agent(
        name=name,
        system_prompt=f"{role}: do your part.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
        **kwargs,
    )


def _call_ends(loss_mask: list[int]) -> list[int]:
    """The index of each call's last sampled token."""
    return [i for i, m in enumerate(loss_mask) if m and (loss_mask[i + 1 :][:1] or [0]) == [0]]


async def _check(app, engine: ScriptedEngine, task: dict | None = None):
    return await agentscope_rft.check_workflow(
        app, task or {"id": "t"}, engine=engine, timeout=60, show=False
    )


async def test_rewards_emitted_for_named_agents_reach_their_calls(engine):
    async def app(task, model):
        alice, bob = _agent("alice", "ALICE", model), _agent("bob", "BOB", model)
        for _ in range(2):  # two rounds, the agents concurrently
            await asyncio.gather(
                alice.reply(UserMsg(name="user", content="go")),
                bob.reply(UserMsg(name="user", content="go")),
            )
        agentscope_rft.emit_reward(1.0, agent="alice")  # her latest call
        agentscope_rft.emit_reward(-1.0, agent="bob", step=0)
        if task.get("unknown"):
            agentscope_rft.emit_reward(0.5, agent="carol")
        return 0.25

    report = await _check(app, engine)
    assert report.rollout.ok, report.rollout.error
    by_agent = {s.agent_name: s for s in report.samples}
    assert sorted(by_agent) == ["alice", "bob"]
    alice, bob = by_agent["alice"], by_agent["bob"]
    assert alice.num_calls == bob.num_calls == 2 and alice.reward == bob.reward == 0.25
    ends = {name: _call_ends(s.loss_mask) for name, s in by_agent.items()}
    assert alice.token_rewards is not None and bob.token_rewards is not None
    assert [alice.token_rewards[i] for i in ends["alice"]] == [0.0, 1.0]
    assert [bob.token_rewards[i] for i in ends["bob"]] == [-1.0, 0.0]
    assert sum(alice.token_rewards) == 1.0 and sum(bob.token_rewards) == -1.0

    failed = await _check(app, engine, {"id": "t", "unknown": True})
    assert failed.rollout.status is RolloutStatus.FAILED
    assert "agent='carol'): that agent has made no model call" in (failed.rollout.error or "")
    assert "'alice', 'bob'" in (failed.rollout.error or "")


async def test_a_user_simulator_called_outside_the_rollout_scope_is_not_trained(engine):
    provider = ScriptedEngine(lambda messages, tools: "tell me more")  # the simulator's own API

    async with Gateway(provider) as simulator_api:

        async def app(task, model):
            simulator = OpenAIChatModel(
                credential=OpenAICredential(
                    api_key="k", base_url=simulator_api.rollout_base_url("sim")
                ),
                model="gpt-4o-mini",
                stream=False,
            )
            user = _agent("user_sim", "USER_SIM", simulator)
            assistant = _agent("assistant", "ASSISTANT", model)
            message = UserMsg(name="user", content="hello")
            for _ in range(2):
                answer = await assistant.reply(message)
                with rollout_scope(None):  # its own provider, as outside an episode
                    message = await user.reply(
                        UserMsg(name="assistant", content=answer.get_text_content())
                    )
            return 1.0

        report = await _check(app, engine)
    assert report.rollout.ok, report.rollout.error
    assert [c.agent_name for c in report.rollout.calls] == ["assistant", "assistant"]
    assert [s.agent_name for s in report.samples] == ["assistant"]
    assert report.samples[0].num_calls == 2
    assert len(provider.requests) == 2
