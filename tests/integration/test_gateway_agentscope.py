"""A real AgentScope agent with tools runs its tool loop against the gateway; calls are exact."""

import pytest

from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.chat.tools import parse_tool_calls

from . import calc_app


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_tool_loop_completes_and_calls_are_exact(calc_gateway, stream):
    answer = await calc_app.run_episode(calc_gateway.rollout_base_url("ep"), stream=stream)
    assert answer == "The answer is 20."

    engine = calc_gateway.engine
    tokenizer = engine.tokenizer
    renderer = ChatRenderer(tokenizer)
    calls = calc_gateway.recorder.calls("ep")
    assert len(calls) == 3
    for call, script in zip(calls, calc_app.SCRIPT, strict=True):
        assert call.completion_ids[-1] == tokenizer.eos_token_id
        generated = tokenizer.decode(call.completion_ids[:-1])
        assert generated == script
        parsed = parse_tool_calls(generated)
        assert call.tool_calls == [
            type(tc)(tc.id.replace(tc.id, call.tool_calls[i].id), tc.name, tc.arguments)
            for i, tc in enumerate(parsed.tool_calls)
        ]
        assert (call.content or None) == (parsed.content or None)
        # The prompt is the chat-template rendering of the request (reused tokens included).
        assert call.prompt_ids == renderer.render_ids(call.messages, call.tools)
        assert len(call.logprobs) == len(call.completion_ids)
        assert call.agent_name is None or call.agent_name == "calc"
    assert [c.finish_reason for c in calls] == ["tool_calls", "tool_calls", "stop"]
    assert calls[0].prompt_reused_tokens == 0
    assert calls[1].prompt_reused_tokens == len(calls[0].prompt_ids) + len(calls[0].completion_ids)
    assert calls[2].prompt_reused_tokens > calls[1].prompt_reused_tokens
