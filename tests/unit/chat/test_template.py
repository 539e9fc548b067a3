import pytest

from agentscope_rft.chat.template import ChatFormatError, ChatRenderer, normalize_messages
from agentscope_rft.models import load_tokenizer, resolve_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "name": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": "2+3?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a":2}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c0", "content": "5"},
    {"role": "tool", "tool_call_id": "c1", "content": "6"},
    {"role": "assistant", "content": [{"type": "text", "text": "It is 5."}]},
]


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(load_tokenizer(resolve_model("tiny-random")))


def test_normalize_flattens_parts_and_canonicalizes_arguments():
    out = normalize_messages(CONVERSATION)
    assert out[0] == {"role": "system", "content": "Be brief."}
    assert out[2]["tool_calls"][0]["function"]["arguments"] == '{"a": 2}'
    assert out[2]["content"] == ""


def test_an_assistant_messages_thinking_reaches_the_template_as_vllm_hands_it():
    """`reasoning_content` (what the gateway returns, so what an OpenAI client sends back) or
    `reasoning`: Qwen3's template renders it; it was dropped, so the embedded engine rendered
    another prompt than vLLM for the same request."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
        "{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    renderer = ChatRenderer(load_tokenizer(resolve_model("tiny-random")), template)
    for field in ("reasoning_content", "reasoning"):
        reply = {"role": "assistant", "content": "4", field: "Two and two."}
        text = renderer.render_text([{"role": "user", "content": "2+2?"}, reply], None, False)
        assert "<|im_start|>assistant\n<think>\nTwo and two.\n</think>\n\n4<|im_end|>" in text
    with pytest.raises(ChatFormatError, match=r"messages\[0\]\.reasoning_content must be a str"):
        normalize_messages([{"role": "assistant", "content": "4", "reasoning_content": 5}])


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "messages[0].content[0]",
        ),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}],
            "messages[0].tool_calls[0]",
        ),
        (["not a dict"], "messages[0]"),
    ],
)
def test_bad_messages_name_the_field(messages, fragment):
    with pytest.raises(ChatFormatError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        normalize_messages(messages)


def test_render_matches_hermes_layout(renderer):
    text = renderer.render_text(CONVERSATION, TOOLS, add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '<tools>\n{"type": "function", "function": {"name": "add"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n'
        "</tool_call><|im_end|>\n"
    ) in text
    # consecutive tool results share one user turn
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n"
        "</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\nIt is 5.<|im_end|>\n")


def test_default_system_prompt_without_system_message(renderer):
    text = renderer.render_text([{"role": "user", "content": "hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_template_is_append_only(renderer):
    # Every cut between turns is a prefix, except inside a run of tool results (they share one
    # user turn; an agent always sends the whole run before the next model call).
    for k in range(1, len(CONVERSATION)):
        if CONVERSATION[k - 1]["role"] == "tool" and CONVERSATION[k]["role"] == "tool":
            continue
        prefix = renderer.render_text(CONVERSATION[:k], TOOLS, add_generation_prompt=False)
        assert renderer.render_text(CONVERSATION, TOOLS, False).startswith(prefix)
        if CONVERSATION[k]["role"] == "assistant":
            prompt = renderer.render_text(CONVERSATION[:k], TOOLS, add_generation_prompt=True)
            assert renderer.render_text(CONVERSATION, TOOLS, False).startswith(prompt)


def test_assistant_mask_covers_exactly_the_assistant_turns(renderer):
    ids, mask = renderer.render_ids_with_mask(CONVERSATION, TOOLS)
    tok = renderer.tokenizer
    trained = [t for t, m in zip(ids, mask, strict=True) if m]
    decoded = tok.decode(trained)
    assert decoded == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
        "<|im_end|>It is 5.<|im_end|>"
    )
    assert tok.decode(ids) == renderer.render_text(CONVERSATION, TOOLS, False)


@pytest.fixture(scope="module")
def base_renderer():
    """A base model's tokenizer (eos `<|endoftext|>`, as Qwen2.5 base) with the ChatML template,
    whose turns end with `<|im_end|>`."""
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    tokenizer.eos_token = "<|endoftext|>"
    return ChatRenderer(tokenizer)


def test_end_of_turn_is_read_from_the_template(renderer, base_renderer):
    assert renderer.end_of_turn == base_renderer.end_of_turn == "<|im_end|>"
    tok = base_renderer.tokenizer
    assert base_renderer.end_of_turn_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert base_renderer.end_of_turn_id != tok.eos_token_id


def test_assistant_mask_ends_at_the_templates_end_of_turn_not_eos(base_renderer):
    ids, mask = base_renderer.render_ids_with_mask(CONVERSATION, TOOLS)
    tok = base_renderer.tokenizer
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
        "<|im_end|>It is 5.<|im_end|>"
    )


def test_end_of_turn_falls_back_to_eos_when_the_template_writes_no_special_token():
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert ChatRenderer(tokenizer, plain).end_of_turn == tokenizer.eos_token


def test_no_eos_and_no_end_of_turn_in_the_template_is_refused_naming_the_fix():
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    tokenizer.eos_token = None
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ChatFormatError, match=r"no eos token.*model\.chat_template"):
        ChatRenderer(tokenizer, plain)
    assert ChatRenderer(tokenizer).end_of_turn == "<|im_end|>"  # its own template closes turns


def test_a_tokenizer_without_a_template_names_its_folder_and_the_fix():
    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    tokenizer.chat_template = None
    with pytest.raises(
        ChatFormatError,
        match=r"tiny-random has no chat template.*model\.chat_template \(`agentscope-rft serve "
        r"--chat-template`\)",
    ):
        ChatRenderer(tokenizer)


async def test_a_template_that_refuses_the_messages_is_a_400_naming_its_reason(tiny_model_path):
    """Qwen3's template raises "No user query found in messages." for a conversation without a
    user turn: the engine answers 400 with that reason (before: a 500 with a traceback)."""
    from agentscope_rft.engines.base import ChatRequest, EngineError
    from agentscope_rft.engines.embedded import EmbeddedEngine
    from agentscope_rft.types import SamplingParams

    template = (
        "{%- if messages[0].role != 'user' -%}"
        "{{ raise_exception('No user query found in messages.') }}{%- endif -%}"
        + ChatRenderer(load_tokenizer(resolve_model("tiny-random"))).chat_template
    )
    engine = EmbeddedEngine(tiny_model_path, chat_template=template)  # not started: renders only
    request = ChatRequest(
        messages=[{"role": "system", "content": "Be brief."}], sampling=SamplingParams()
    )
    with pytest.raises(EngineError, match="No user query found in messages") as caught:
        [event async for event in engine.chat(request)]
    assert caught.value.status == 400 and caught.value.param == "messages"
