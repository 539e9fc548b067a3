"""Tool-call edge cases of a real AgentScope ReAct agent through the gateway (scripted replies)."""

from __future__ import annotations

import httpx
import openai
import pytest
from agentscope.message import UserMsg

from agentscope_rft.explorer.explorer import ExploreResult
from agentscope_rft.explorer.trajectory import TrajectoryStats, build_samples
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine
from agentscope_rft.types import Rollout

from . import calc_app

TWO_CALLS = (
    "Both.\n"
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 5, "b": 4}}\n</tool_call>'
)


def _script(*replies: str):
    """Reply number k of the episode (by the assistant turns so far)."""

    def reply(messages, tools) -> str:
        done = sum(m["role"] == "assistant" for m in messages)
        return replies[min(done, len(replies) - 1)]

    return reply


async def _episode(engine: ScriptedEngine, stream: bool, parallel: bool):
    gateway = Gateway(engine)
    await gateway.start()
    try:
        model = calc_app.build_model(gateway.rollout_base_url("ep"), stream)
        model.parameters.max_tokens = 256
        model.parameters.parallel_tool_calls = parallel
        agent = calc_app.build_agent(model)
        answer = await agent.reply(UserMsg(name="user", content=calc_app.QUESTION))
        return answer.get_text_content(), gateway.recorder.calls("ep")
    finally:
        await gateway.stop()


async def test_parallel_calls_run_and_the_next_prompt_reuses_the_sampled_tokens():
    engine = ScriptedEngine(_script(TWO_CALLS, "5 and 20."))
    answer, calls = await _episode(engine, stream=True, parallel=True)
    assert answer == "5 and 20."
    first, second = calls
    assert [(t.name, t.arguments) for t in first.tool_calls] == [
        ("add", '{"a": 2, "b": 3}'),
        ("multiply", '{"a": 5, "b": 4}'),
    ]
    assert len({t.id for t in first.tool_calls}) == 2
    results = [m for m in second.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [t.id for t in first.tool_calls]
    assert second.prompt_reused_tokens == len(first.prompt_ids) + len(first.completion_ids)
    [sample], _ = build_samples(Rollout("ep", "t", {}, calls, 1.0))  # one merged sample
    assert sample.num_trained_tokens == len(first.completion_ids) + len(second.completion_ids)


async def test_parallel_tool_calls_false_hands_the_agent_one_call():
    """As OpenAI and vLLM do: the first call only; the recorded tokens stay what was sampled and
    the next prompt still continues them."""
    engine = ScriptedEngine(_script(TWO_CALLS, "5."))
    answer, calls = await _episode(engine, stream=False, parallel=False)
    assert answer == "5."
    first, second = calls
    assert [t.name for t in first.tool_calls] == ["add"]
    assert first.finish_reason == "tool_calls"
    assert engine.tokenizer.decode(first.completion_ids[:-1]) == TWO_CALLS  # exact tokens kept
    assert [m["content"] for m in second.messages if m["role"] == "tool"] == ["5"]
    assert second.prompt_reused_tokens == len(first.prompt_ids) + len(first.completion_ids)


BAD_JSON = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": }\n</tool_call>'
UNKNOWN = '<tool_call>\n{"name": "divide", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
GOOD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


async def test_invalid_tool_calls_reach_the_agent_and_the_step_metrics():
    """Markup that does not parse is the agent's answer (text); a call to an unknown tool gets
    AgentScope's error as its result; the step's `explore/invalid_tool_call_rate` counts both."""
    rollouts = []
    for name, script in {
        "bad": (BAD_JSON,),
        "unknown": (UNKNOWN, "ok."),
        "good": (GOOD, "5."),
    }.items():
        answer, calls = await _episode(ScriptedEngine(_script(*script)), stream=True, parallel=True)
        rollouts.append(Rollout(name, name, {}, calls, 1.0))
        if name == "bad":
            assert answer == BAD_JSON and calls[0].tool_calls == []
        if name == "unknown":
            [result] = [m["content"] for m in calls[1].messages if m["role"] == "tool"]
            assert "divide" in str(result)
    result = ExploreResult(rollouts=rollouts, samples=[], trajectory=TrajectoryStats(), seconds=1)
    assert result.metrics()["explore/invalid_tool_call_rate"] == 2 / 5  # of 5 replies to tools


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_a_call_with_a_lone_surrogate_escape_is_served_as_text(stream):
    """A model's `\\ud83d` (half an emoji's escape) in a call's arguments was a 500 (a broken
    stream) and made the rollout's recorded calls unreadable."""
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": "\\ud83d"}}\n</tool_call>'
    async with Gateway(ScriptedEngine(_script(reply))) as gateway:
        client = openai.AsyncOpenAI(
            base_url=gateway.rollout_base_url("r"), api_key="k", max_retries=0
        )
        kwargs = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        kwargs["tools"] = [{"type": "function", "function": {"name": "add"}}]
        if stream:
            chunks = [c async for c in await client.chat.completions.create(**kwargs, stream=True)]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            content = (await client.chat.completions.create(**kwargs)).choices[0].message.content
        assert content == reply
        async with httpx.AsyncClient() as http:
            recorded = await http.get(gateway.rollout_base_url("r").removesuffix("/v1"))
        assert recorded.status_code == 200
        assert recorded.json()["calls"][0]["content"] == reply
