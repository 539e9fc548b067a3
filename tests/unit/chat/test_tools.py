import json
import random

import pytest

from agentscope_rft.chat.tools import StreamingToolParser, invalid_tool_call, parse_tool_calls


def test_single_call_with_content():
    out = parse_tool_calls(
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    )
    assert out.content == "Let me add."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("add", {"a": 1, "b": 2})
    ]
    assert not out.malformed_tool_call


def test_list_payload_and_string_arguments():
    text = (
        '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": '
        '"{\\"x\\": 1}"}]</tool_call>'
    )
    out = parse_tool_calls(text)
    assert out.content is None
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("a", "{}"), ("b", '{"x": 1}')]
    assert len({c.id for c in out.tool_calls}) == 2


def test_two_blocks():
    text = (
        '<tool_call>\n{"name": "a", "arguments": {"q": "x"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "b", "arguments": {}}\n</tool_call>'
    )
    assert [c.name for c in parse_tool_calls(text).tool_calls] == ["a", "b"]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',  # arguments not an object
        'hi <tool_call>{"name": "add", "arguments": {}}',  # unterminated (hit max_tokens)
    ],
)
def test_malformed_calls_become_plain_content(text):
    out = parse_tool_calls(text)
    assert out.tool_calls == []
    assert out.content == text
    assert out.malformed_tool_call


def test_plain_text_is_kept_exactly():
    assert parse_tool_calls("  answer: 42\n").content == "  answer: 42\n"


TEXTS = [
    "plain answer with trailing space \n",
    'Thinking.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
    "a < b and <tool not a call",
    'broken <tool_call>{"name": }</tool_call> tail',
    "ends with partial <tool_ca",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_equals_batch_for_any_chunking(text):
    rng = random.Random(0)
    expected = parse_tool_calls(text)
    for _ in range(30):
        parser = StreamingToolParser()
        streamed, i = "", 0
        while i < len(text):
            j = i + rng.randint(1, 5)
            streamed += parser.feed(text[i:j])
            i = j
        rest, result = parser.finish()
        assert streamed + rest == (expected.content or "")
        assert result == expected


def test_invalid_tool_call_needs_offered_tools_and_names_them():
    tools = [{"type": "function", "function": {"name": "add"}}]
    good = parse_tool_calls('<tool_call>{"name": "add", "arguments": {}}</tool_call>')
    assert not invalid_tool_call(good.content, good.tool_calls, tools)
    assert not invalid_tool_call("The answer is 3.", [], tools)
    bad = parse_tool_calls('<tool_call>{"name": "add", "arguments": [1]}</tool_call>')
    assert invalid_tool_call(bad.content, bad.tool_calls, tools)
    assert not invalid_tool_call(bad.content, bad.tool_calls, None)  # no tools: plain text
    unknown = parse_tool_calls('<tool_call>{"name": "sub", "arguments": {}}</tool_call>')
    assert invalid_tool_call(unknown.content, unknown.tool_calls, tools)


def test_a_lone_surrogate_escape_is_a_malformed_call():
    """JSON may escape half of a UTF-16 pair (`\\ud83d`); no UTF-8 text holds it, so the call is
    malformed (plain content, the text as generated) rather than a response that cannot be sent."""
    text = '<tool_call>{"name": "f", "arguments": {"s": "\\ud83d oops"}}</tool_call>'
    out = parse_tool_calls(text)
    assert out.tool_calls == [] and out.content == text and out.malformed_tool_call
    assert parse_tool_calls(text.replace('"f"', '"\\udc00"')).malformed_tool_call
    pair = parse_tool_calls(text.replace("\\ud83d oops", "\\ud83d\\ude00"))
    assert [json.loads(c.arguments) for c in pair.tool_calls] == [{"s": "\U0001f600"}]
