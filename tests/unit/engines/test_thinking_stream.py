"""Thinking split off replies by the engines' chat layer: streamed token by token exactly as the
whole reply is split, tool calls parsed from the answer only, and the vLLM chat path's fields."""

from __future__ import annotations

import pytest

from agentscope_rft.chat.reasoning import prompt_opens_thinking
from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.engines.base import GenerationOutput
from agentscope_rft.engines.chat import TextStream, assemble_choice
from agentscope_rft.engines.vllm_chat import VLLMCalls
from agentscope_rft.models import TINY_MODEL, load_tokenizer, resolve_model
from tests.thinking_template import QWEN3_LIKE, R1_LIKE

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
REPLIES = [
    # (completion text, prompt opened the think block)
    (f"<think>\nShould I write <tool_call> here? Yes.\n</think>\n\n{CALL}", False),
    ("<think>\nHmm, 2+2.\n</think>\n\nIt is 4. </think> is a tag.", False),
    ("<think>\nnever closed, cut at max_tokens", False),
    (f"R1 thinks first.\n</think>\n\nDone.\n{CALL}", True),
    ("Plain answer, no thinking.", False),
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(TINY_MODEL))


@pytest.mark.parametrize(("text", "opened"), REPLIES)
@pytest.mark.parametrize("parse_tools", [False, True])
def test_streamed_thinking_and_answer_equal_the_whole_split(tokenizer, text, opened, parse_tools):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer.encode(text, add_special_tokens=False), eos]
    output = GenerationOutput(ids, [0.0] * len(ids), "stop", 0)
    choice = assemble_choice(
        0, output, tokenizer, {eos}, parse_tools, "c", split_thinking=True, thinking_opened=opened
    )
    stream = TextStream(tokenizer, [], parse_tools, split_thinking=True, thinking_opened=opened)
    content, reasoning = "", ""
    for token in ids:
        content += stream.push(token)
        reasoning += stream.take_reasoning()
    content += stream.finish(choice.text)
    reasoning += stream.take_reasoning()
    assert reasoning == (choice.reasoning or "")
    assert content == (choice.content or "")
    assert choice.text == text  # the whole reply stays, for the record
    if CALL in text and parse_tools:
        assert [c.name for c in choice.tool_calls] == ["add"]
        assert choice.finish_reason == "tool_calls"
    if text.startswith("<think>") or opened:
        assert "<think>" not in (choice.content or "") and choice.reasoning


def test_without_the_split_a_tool_call_mentioned_while_thinking_loses_the_call(tokenizer):
    """Why the split matters to agents: the thinking's `<tool_call>` makes the text malformed."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text, _ = REPLIES[0]
    ids = [*tokenizer.encode(text, add_special_tokens=False), eos]
    output = GenerationOutput(ids, [0.0] * len(ids), "stop", 0)
    plain = assemble_choice(0, output, tokenizer, {eos}, True, "c")
    assert plain.tool_calls == [] and plain.content == text and plain.reasoning is None
    split = assemble_choice(0, output, tokenizer, {eos}, True, "c", split_thinking=True)
    assert [c.name for c in split.tool_calls] == ["add"] and split.content is None


def test_a_prompt_that_opens_thinking_is_recognised(tokenizer):
    user = [{"role": "user", "content": "hi"}]
    assert prompt_opens_thinking(tokenizer, ChatRenderer(tokenizer, R1_LIKE).render_ids(user))
    assert not prompt_opens_thinking(
        tokenizer, ChatRenderer(tokenizer, QWEN3_LIKE).render_ids(user)
    )


def _vllm_calls(tokenizer, split: bool) -> VLLMCalls:
    renderer = ChatRenderer(tokenizer, QWEN3_LIKE)
    return VLLMCalls(None, None, tokenizer, renderer, None, split_thinking=split)  # type: ignore[arg-type]


def test_vllm_chat_takes_vllms_own_split_else_splits_its_content(tokenizer):
    prompt = ChatRenderer(tokenizer, QWEN3_LIKE).render_ids([{"role": "user", "content": "hi"}])
    by_vllm = {"message": {"content": "4", "reasoning_content": "2+2"}}
    inline = {"message": {"content": "<think>\n2+2\n</think>\n\n4"}}
    calls = _vllm_calls(tokenizer, split=True)
    assert calls._vllm_reasoning(by_vllm, "4", prompt) == ("2+2", "4")
    assert calls._vllm_reasoning(inline, inline["message"]["content"], prompt) == ("2+2", "4")
    off = _vllm_calls(tokenizer, split=False)
    assert off._vllm_reasoning(inline, inline["message"]["content"], prompt) == (
        None,
        inline["message"]["content"],
    )
