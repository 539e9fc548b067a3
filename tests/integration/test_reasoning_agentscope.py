"""A reasoning model (Qwen3-like template that drops earlier thinking) behind the gateway: the
AgentScope agent gets ThinkingBlocks and clean answers, tool calls after (and mentioned inside)
the thinking parse, and the episode trains as one sample of the exact sampled tokens."""

from __future__ import annotations

import itertools

import pytest
from agentscope.message import UserMsg

from agentscope_rft.chat.template import decode_text
from agentscope_rft.engines.base import ChatRequest, ChoiceDone, ContentDelta, ReasoningDelta
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.explorer.trajectory import build_samples
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine
from agentscope_rft.types import Rollout, SamplingParams
from tests.thinking_template import QWEN3_LIKE, R1_LIKE

from . import calc_app

SCRIPT = [
    "<think>\nFirst 2+3. I will write <tool_call> with add.\n</think>\n\n"
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    "<think>\nNow 5*4.\n</think>\n\n"
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 5, "b": 4}}\n</tool_call>',
    "<think>\n5*4 is 20.\n</think>\n\nThe answer is 20.",
]


def _reply(messages, tools):
    return SCRIPT[sum(m["role"] == "tool" for m in messages)]


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_a_thinking_agent_answers_cleanly_and_trains_on_its_sampled_tokens(stream):
    engine = ScriptedEngine(_reply, chat_template=QWEN3_LIKE)  # reasoning_parser: auto
    async with Gateway(engine) as gateway:
        agent = calc_app.build_agent(calc_app.build_model(gateway.rollout_base_url("ep"), stream))
        reply = await agent.reply(UserMsg(name="user", content=calc_app.QUESTION))
        calls = gateway.recorder.calls("ep")

    assert reply.get_text_content() == "The answer is 20."
    thoughts = [b.thinking for b in reply.content if getattr(b, "type", None) == "thinking"]
    assert thoughts == ["5*4 is 20."]
    assert [c.reasoning for c in calls] == [
        "First 2+3. I will write <tool_call> with add.",
        "Now 5*4.",
        "5*4 is 20.",
    ]
    assert [[t.name for t in c.tool_calls] for c in calls] == [["add"], ["multiply"], []]
    assert [c.content for c in calls] == [None, None, "The answer is 20."]
    # The history AgentScope sends back has no thinking, and the template would drop it anyway:
    # the engine puts the sampled tokens (thinking included) back in the next prompt instead.
    assert all("<think>" not in str(m.get("content")) for c in calls for m in c.messages)
    for earlier, later in itertools.pairwise(calls):
        full = earlier.prompt_ids + earlier.completion_ids
        assert later.prompt_reused_tokens == len(full)
        assert later.prompt_ids[: len(full)] == full

    rollout = Rollout(rollout_id="ep", task_id="t", task={}, calls=calls, reward=1.0)
    [sample], stats = build_samples(rollout)
    assert stats.merges == 2 and not stats.breaks
    trained = [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
    assert trained == [t for c in calls for t in c.completion_ids]
    assert engine.tokenizer.decode(trained).count("<think>") == 3


async def test_the_embedded_engine_streams_thinking_a_prompt_opened(tiny_model_path):
    """DeepSeek-R1's template opens `<think>` in the prompt: the tiny random model's whole reply
    (it never writes `</think>`) is thinking, streamed as reasoning deltas, the content empty."""
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu", chat_template=R1_LIKE)
    await engine.start()
    try:
        request = ChatRequest(
            messages=[{"role": "user", "content": "hi"}],
            sampling=SamplingParams(max_tokens=12, temperature=1.0, seed=1),
            stream=True,
        )
        events = [event async for event in engine.chat(request)]
    finally:
        await engine.close()
    [done] = [e.choice for e in events if isinstance(e, ChoiceDone)]
    streamed = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert not [e for e in events if isinstance(e, ContentDelta)]
    assert done.content == "" and done.reasoning == streamed
    assert streamed and streamed == decode_text(engine.tokenizer, done.completion_ids).strip("\n")


async def test_without_prompt_reuse_each_turn_breaks_and_check_says_why():
    """`engine.reuse_prompt_tokens: false`: the template's rendering drops the earlier thinking,
    so every turn is a sample of its own; `check_workflow` says once that this is expected."""
    from agentscope_rft.check import check_workflow

    async def run(task, model):
        agent = calc_app.build_agent(model)
        reply = await agent.reply(UserMsg(name="user", content=calc_app.QUESTION))
        return float(reply.get_text_content() == "The answer is 20.")

    engine = ScriptedEngine(_reply, chat_template=QWEN3_LIKE)
    engine.prompts.reuse = False
    report = await check_workflow(run, {"id": "t"}, engine=engine, show=False)
    assert report.rollout.reward == 1.0 and len(report.samples) == 3
    assert "; thinking: 'Now 5*4.'; text: ''" in report.render()
    [warning] = [w for w in report.warnings if "did not continue" in w]
    assert warning.startswith(
        "2 call(s) did not continue the previous one (completion_retokenized)"
    )
    assert "expected for a reasoning model" in warning


async def test_chat_template_kwargs_turn_qwen3_thinking_off_and_bad_ones_are_named():
    """`extra_body={"chat_template_kwargs": {"enable_thinking": False}}`, as with vLLM: the prompt
    closes an empty think block, the reply is all answer, and the next turn still reuses it."""
    import httpx

    engine = ScriptedEngine(lambda m, t: "Quick answer.", chat_template=QWEN3_LIKE)
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    first = [{"role": "user", "content": "hi"}]
    async with Gateway(engine) as gateway, httpx.AsyncClient() as http:
        url = gateway.rollout_base_url("ep") + "/chat/completions"
        r = await http.post(url, json={"model": "m", "messages": first, **off})
        message = r.json()["choices"][0]["message"]
        second = [*first, message, {"role": "user", "content": "and?"}]
        await http.post(url, json={"model": "m", "messages": second, **off})
        bad = await http.post(
            url, json={"model": "m", "messages": first, "chat_template_kwargs": {"tools": []}}
        )
        calls = gateway.recorder.calls("ep")
    assert message == {"role": "assistant", "content": "Quick answer."}
    prompt = engine.tokenizer.decode(calls[0].prompt_ids)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert calls[1].prompt_reused_tokens == len(calls[0].prompt_ids) + len(calls[0].completion_ids)
    assert bad.status_code == 400
    assert (
        "chat_template_kwargs: Value error, tools cannot be set here"
        in bad.json()["error"]["message"]
    )


async def test_offline_sft_data_with_reasoning_content_is_the_engines_sample(tmp_path):
    """A conversation written as SFT data (assistant turns' `reasoning_content`, as the gateway
    returned them) tokenizes as the engine sampled and merged it: each turn keeps its thinking,
    although the template drops earlier turns' thinking (it was refused, and a lone turn's
    `reasoning_content` was dropped: SFT taught answers without thinking)."""
    import json

    import httpx

    from agentscope_rft.buffer.offline import load_sft_samples
    from agentscope_rft.chat.template import ChatRenderer

    replies = iter(["<think>\nTwo and two.\n</think>\n\nFour.", "<think>\nB\n</think>\n\nSix."])
    engine = ScriptedEngine(lambda m, t: next(replies), chat_template=QWEN3_LIKE)
    messages: list[dict] = [{"role": "user", "content": "2+2?"}]
    async with Gateway(engine) as gateway, httpx.AsyncClient() as http:
        url = gateway.rollout_base_url("ep") + "/chat/completions"
        for question in ("3+3?", None):
            r = await http.post(url, json={"model": "m", "messages": messages})
            messages.append(r.json()["choices"][0]["message"])
            if question:
                messages.append({"role": "user", "content": question})
        calls = gateway.recorder.calls("ep")
    assert messages[1] == {
        "role": "assistant",
        "content": "Four.",
        "reasoning_content": "Two and two.",
    }
    [sample], _ = build_samples(Rollout("ep", "t", {}, calls=calls, reward=1.0))
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": messages}) + "\n")
    [offline] = load_sft_samples(data, ChatRenderer(engine.tokenizer, QWEN3_LIKE))
    assert offline.token_ids == sample.token_ids
    assert offline.loss_mask == sample.loss_mask
