"""Prompt reuse with reasoning models' templates, which render a reply's thinking only while it
is the last turn: the next prompt still starts with the exact sampled tokens, thinking included."""

import pytest

from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.engines.base import ChatRequest, GenerationOutput
from agentscope_rft.engines.chat import PromptBuilder, assemble_choice
from agentscope_rft.models import load_tokenizer, resolve_model
from agentscope_rft.types import SamplingParams
from tests.thinking_template import QWEN3_LIKE, R1_LIKE


@pytest.mark.parametrize(
    ("template", "reply"),
    [
        (QWEN3_LIKE, "<think>\nGreet back.\n</think>\n\nhello"),
        (R1_LIKE, "Greet back.\n</think>\n\nhello"),
    ],
    ids=["qwen3", "r1"],
)
def test_the_next_user_turn_continues_the_sampled_thinking(template, reply):
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    renderer = ChatRenderer(tokenizer, template)
    builder = PromptBuilder(renderer)
    first = [{"role": "user", "content": "hi"}]
    request = ChatRequest(messages=first, sampling=SamplingParams(), rollout_id="r1")
    prompt_ids, _ = builder.build(request)
    completion = [*renderer.encode(reply), renderer.end_of_turn_id]
    output = GenerationOutput(completion, [0.0] * len(completion), "stop", 0)
    choice = assemble_choice(
        0, output, tokenizer, {renderer.end_of_turn_id}, False, "c",
        split_thinking=True, thinking_opened=template is R1_LIKE,
    )  # fmt: skip
    assert (choice.reasoning, choice.content) == ("Greet back.", "hello")
    builder.remember(request, prompt_ids, [choice])

    # As AgentScope sends it back: the answer alone (its formatter drops ThinkingBlocks).
    second = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    ids, reused = builder.build(
        ChatRequest(messages=second, sampling=SamplingParams(), rollout_id="r1")
    )
    assert reused == len(prompt_ids) + len(completion)
    assert ids[:reused] == prompt_ids + completion
    # The new turns after the reply are the template's own rendering of them.
    rendered = renderer.render_text(second, None, True)
    assert (
        renderer.tokenizer.decode(ids[reused:])
        == rendered[rendered.rindex("<|im_end|>\n<|im_start|>user") + len("<|im_end|>") :]
    )
