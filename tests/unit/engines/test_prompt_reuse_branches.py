"""Prompt reuse holds for many conversations of one agent name in a rollout (a fan-out)."""

import pytest

from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.engines.base import ChatRequest, GenerationOutput
from agentscope_rft.engines.chat import PromptBuilder, assemble_choice
from agentscope_rft.models import load_tokenizer, resolve_model
from agentscope_rft.types import SamplingParams


def _sampled(builder, tokenizer, messages, text):
    """Build the request's prompt and answer `text` sampled one character per token (a
    re-tokenization would merge them, so only reuse reproduces it)."""
    request = ChatRequest(
        messages=messages, sampling=SamplingParams(), rollout_id="r", agent_name="solver"
    )
    prompt_ids, reused = builder.build(request)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    completion = [*[tokenizer.convert_tokens_to_ids(c) for c in text], eos]
    output = GenerationOutput(completion, [0.0] * len(completion), "stop", 0)
    builder.remember(
        request, prompt_ids, [assemble_choice(0, output, tokenizer, {eos}, False, "c")]
    )
    return prompt_ids + completion, reused


@pytest.mark.parametrize("same_question", [False, True])
def test_each_of_many_side_by_side_conversations_reuses_its_own_sampled_tokens(same_question):
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    builder = PromptBuilder(ChatRenderer(tokenizer))
    branches = 12  # 12 copies of one agent, each asked twice, the second round after the first
    questions = [f"question {0 if same_question else k}" for k in range(branches)]
    firsts = [[{"role": "user", "content": question}] for question in questions]
    seconds = []
    for k, messages in enumerate(firsts):
        full, _ = _sampled(builder, tokenizer, messages, f"hello{k}")
        seconds.append((full, [*messages, {"role": "assistant", "content": f"hello{k}"}]))
    for k, (first_full, history) in enumerate(seconds):
        messages = [*history, {"role": "user", "content": "sure?"}]
        second_full, reused = _sampled(builder, tokenizer, messages, "yes")
        assert reused == len(first_full), k
        assert second_full[: len(first_full)] == first_full
        # and a third turn continues the second
        third = [
            *messages,
            {"role": "assistant", "content": "yes"},
            {"role": "user", "content": "ok"},
        ]
        _, reused = _sampled(builder, tokenizer, third, "done")
        assert reused == len(second_full), k


def test_a_conversation_that_goes_back_a_turn_still_reuses_the_earlier_turn():
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    builder = PromptBuilder(ChatRenderer(tokenizer))
    history = [{"role": "user", "content": "start"}]
    full, _ = _sampled(builder, tokenizer, history, "one")
    history += [{"role": "assistant", "content": "one"}, {"role": "user", "content": "next"}]
    _sampled(builder, tokenizer, history, "two")
    # the app discards the reply "two" and asks again from the first reply
    retry = [*history[:2], {"role": "user", "content": "try another"}]
    _, reused = _sampled(builder, tokenizer, retry, "three")
    assert reused == len(full)


def test_a_reply_cut_at_the_token_limit_is_reused_with_the_end_of_turn_after_it():
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    builder = PromptBuilder(ChatRenderer(tokenizer))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first = [{"role": "user", "content": "hi"}]
    request = ChatRequest(messages=first, sampling=SamplingParams(), rollout_id="r")
    prompt_ids, _ = builder.build(request)
    # "hello" sampled as single characters and cut by max_tokens: no end of turn was sampled
    completion = [tokenizer.convert_tokens_to_ids(c) for c in "hello"]
    output = GenerationOutput(completion, [0.0] * len(completion), "length", 0)
    choice = assemble_choice(0, output, tokenizer, {eos}, False, "c")
    builder.remember(request, prompt_ids, [choice])

    second = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    ids, reused = builder.build(
        ChatRequest(messages=second, sampling=SamplingParams(), rollout_id="r")
    )
    assert ids[:reused] == [*prompt_ids, *completion, eos]
    # the rest is what the template writes after the turn, as a full render has it
    rendered = builder.renderer.render_ids(second, None)
    assert ids[reused:] == rendered[len(rendered) - (len(ids) - reused) :]
    assert len(ids) - len(completion) == len(rendered) - len(builder.renderer.encode("hello"))
