"""Hermes-style tool-call parsing of generated text.

The model writes tool calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
(one object, or a list of objects, per block). Parsing never fails: text whose blocks are not all
valid JSON calls is returned unchanged as plain content, so a malformed call reaches the agent as
text (and the RL signal) instead of a server error.

Content rules keep streamed and non-streamed answers identical and the assistant turn
re-renderable by the chat template: without tool calls the content is the text exactly as
generated; with tool calls it is the text before the first block, right-stripped (the template puts
one newline between content and the first call).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentscope_rft.types import JSON, ToolCall

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")
"""Half a UTF-16 pair: JSON may escape one alone (`\\ud83d`); no UTF-8 text can hold it (a
response or a recorded call carrying it cannot be written), so such a call is malformed."""


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    malformed_tool_call: bool = False
    """The text had `<tool_call>` markup that did not parse (it is returned as content)."""


def _calls_from_json(payload: Any) -> list[tuple[str, str]] | None:
    items = payload if isinstance(payload, list) else [payload]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        dumped = json.dumps(arguments, ensure_ascii=False)
        if _SURROGATE.search(item["name"]) or _SURROGATE.search(dumped):
            return None
        calls.append((item["name"], dumped))
    return calls


def parse_tool_calls(text: str, id_prefix: str = "call") -> ParsedOutput:
    """Split generated text into content and tool calls.

    Example:
        >>> out = parse_tool_calls('Sure.\\n<tool_call>\\n{"name": "add", "arguments": {"a": 1}}'
        ...                        '\\n</tool_call>')
        >>> out.content, out.tool_calls[0].name, out.tool_calls[0].arguments
        ('Sure.', 'add', '{"a": 1}')
    """
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        return ParsedOutput(content=text, malformed_tool_call=TOOL_CALL_OPEN in text)
    parsed: list[tuple[str, str]] = []
    for block in blocks:
        try:
            payload = json.loads(block.group(1).strip())
        except json.JSONDecodeError:
            return ParsedOutput(content=text, malformed_tool_call=True)
        calls = _calls_from_json(payload)
        if calls is None:
            return ParsedOutput(content=text, malformed_tool_call=True)
        parsed.extend(calls)
    content = text[: blocks[0].start()].rstrip() or None
    tool_calls = [
        ToolCall(id=f"{id_prefix}_{i}", name=name, arguments=args)
        for i, (name, args) in enumerate(parsed)
    ]
    return ParsedOutput(content=content, tool_calls=tool_calls)


def invalid_tool_call(
    content: str | None, tool_calls: Sequence[ToolCall], tools: Sequence[JSON] | None
) -> bool:
    """Whether a reply to a request that offered `tools` made a tool call its agent cannot run:
    `<tool_call>` markup that did not parse, or came where `tool_choice: none` allowed no call (it
    stays in the content, and AgentScope takes it for the final answer), or a call naming a
    function that is not among the tools.

    Example:
        >>> tools = [{"type": "function", "function": {"name": "add"}}]
        >>> invalid_tool_call('<tool_call>{"name": "add"', [], tools)
        True
        >>> invalid_tool_call(None, [ToolCall("c0", "divide", "{}")], tools)
        True
    """
    if not tools:
        return False
    if content is not None and TOOL_CALL_OPEN in content:
        return True
    names = {tool.get("function", {}).get("name") for tool in tools if isinstance(tool, dict)}
    return any(call.name not in names for call in tool_calls)


class StreamingToolParser:
    """Incremental twin of `parse_tool_calls` for SSE streaming.

    `feed` returns the content that is safe to send now; text that may belong to a tool call (a
    partial `<tool_call>` tag, anything after one) or trailing whitespace is held back. `finish`
    returns the rest of the content and the parsed result, so the concatenated content deltas equal
    the non-streamed content exactly.

    Example:
        >>> p = StreamingToolParser()
        >>> p.feed("Hello <tool"), p.feed("_call>{}")
        ('Hello', '')
        >>> rest, result = p.finish()
        >>> rest, result.content
        (' <tool_call>{}', 'Hello <tool_call>{}')
    """

    def __init__(self, id_prefix: str = "call") -> None:
        self._text = ""
        self._emitted = 0
        self._id_prefix = id_prefix

    def feed(self, delta: str) -> str:
        self._text += delta
        text = self._text
        tag_at = text.find(TOOL_CALL_OPEN)
        if tag_at >= 0:
            safe_end = tag_at
        else:
            safe_end = len(text)
            # Hold back a suffix that could be the start of "<tool_call>".
            for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
                if TOOL_CALL_OPEN.startswith(text[-k:]):
                    safe_end = len(text) - k
                    break
        # Trailing whitespace is stripped when a tool call follows, so it waits too.
        safe_end = len(text[:safe_end].rstrip())
        if safe_end <= self._emitted:
            return ""
        out = text[self._emitted : safe_end]
        self._emitted = safe_end
        return out

    def finish(self) -> tuple[str, ParsedOutput]:
        result = parse_tool_calls(self._text, self._id_prefix)
        content = result.content or ""
        emitted = self._text[: self._emitted]
        if not content.startswith(emitted):  # pragma: no cover - guarded by the content rules
            raise AssertionError("streamed content diverged from the parsed content")
        return content[len(emitted) :], result
