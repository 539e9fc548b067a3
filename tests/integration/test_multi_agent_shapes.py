"""Multi-agent AgentScope apps: each call is recorded once under its agent, each agent's turns
merge into one sample, rewards reach the agents they name, and one agent's failure fails only
its episode. A scripted engine answers by the agent's system prompt, so tool calls happen."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentscope.agent import Agent, InjectionConfig
from agentscope.message import UserMsg

import agentscope_rft
from agentscope_rft.testing import ScriptedEngine
from agentscope_rft.types import RolloutStatus


def _tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _reply(messages: list[dict], tools: list[dict] | None) -> str:
    """The role is the system prompt's first word; it answers by the turn count."""
    role = str(messages[0]["content"]).split(":")[0]
    turn = sum(m["role"] == "assistant" for m in messages)
    return f"{role} says {turn}."


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
