"""Distinct agents that share a name in one episode are called out (they train as one agent)."""

import logging

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.model import OpenAIChatModel

from agentscope_rft.integration.agentscope import RolloutScope, install, rollout_scope

install()  # tags `reply` of the Agent subclasses defined from now on


class _Replier(Agent):
    async def reply(self, *args, **kwargs):  # no model call: only the tagging runs
        return None


def _agent(name: str, prompt: str) -> Agent:
    model = OpenAIChatModel(credential=OpenAICredential(api_key="k"), model="m")
    return _Replier(name=name, system_prompt=prompt, model=model)


def _scope() -> RolloutScope:
    return RolloutScope("r", "http://127.0.0.1:1/rollouts/r/v1", "k")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def test_distinct_agents_with_different_prompts_sharing_a_name_warn_once(caplog):
    caplog.set_level(logging.WARNING, "agentscope_rft.integration.agentscope")
    for _ in range(2):  # two episodes: one warning for the name
        with rollout_scope(_scope()):
            await _agent("worker-x", "You plan.").reply()
            await _agent("worker-x", "You execute.").reply()
    [message] = _warnings(caplog)
    assert "'worker-x'" in message and "'You plan.'" in message and "'You execute.'" in message
    assert "own `name=`" in message


async def test_one_agent_rebuilt_each_turn_or_reprompted_is_quiet(caplog):
    caplog.set_level(logging.WARNING, "agentscope_rft.integration.agentscope")
    with rollout_scope(_scope()):
        for _ in range(3):  # a new object each turn, the same system prompt
            await _agent("turner-y", "Reply.").reply()
        agent = _agent("edited-y", "First prompt.")
        await agent.reply()
        agent._system_prompt = "Second prompt."  # the same agent, its prompt changed
        await agent.reply()
    # outside an episode nothing is recorded, so nothing is compared
    await _agent("outside-y", "One.").reply()
    await _agent("outside-y", "Two.").reply()
    # each episode compares its own agents
    with rollout_scope(_scope()):
        await _agent("apart-y", "One.").reply()
    with rollout_scope(_scope()):
        await _agent("apart-y", "Two.").reply()
    assert _warnings(caplog) == []
