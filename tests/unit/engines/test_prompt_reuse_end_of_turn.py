"""Prompt reuse with a tokenizer whose eos is not the template's end of turn (a base model)."""

from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.engines.base import ChatRequest, GenerationOutput
from agentscope_rft.engines.chat import PromptBuilder, assemble_choice
from agentscope_rft.models import load_tokenizer, resolve_model
from agentscope_rft.types import SamplingParams


def test_a_reply_ended_by_the_templates_end_of_turn_is_reused_in_the_next_prompt():
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    tokenizer.eos_token = "<|endoftext|>"  # Qwen2.5/Qwen3 base: turns still end with <|im_end|>
    renderer = ChatRenderer(tokenizer)
    builder = PromptBuilder(renderer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first = [{"role": "user", "content": "hi"}]
    request = ChatRequest(messages=first, sampling=SamplingParams(), rollout_id="r1")
    prompt_ids, _ = builder.build(request)
    # "hello" sampled as single characters: a re-tokenization would merge them
    completion = [*[tokenizer.convert_tokens_to_ids(c) for c in "hello"], im_end]
    output = GenerationOutput(completion, [0.0] * len(completion), "stop", 0)
    choice = assemble_choice(0, output, tokenizer, {im_end}, False, "c")
    builder.remember(request, prompt_ids, [choice])

    second = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    ids, reused = builder.build(
        ChatRequest(messages=second, sampling=SamplingParams(), rollout_id="r1")
    )
    assert reused == len(prompt_ids) + len(completion)
    assert ids[:reused] == prompt_ids + completion
