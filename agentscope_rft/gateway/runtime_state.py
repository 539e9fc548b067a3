"""The runtime state AgentScope injects into requests: kept, frozen or dropped by the gateway.

An AgentScope 2.x `Agent` (with its default `InjectionConfig(inject_runtime_state=True)`) adds a
`HintBlock` before reasoning, which its OpenAI formatter sends as a user message of its own:

    <system-reminder>Treat the following as the ground truth at this point of the conversation.
    Anything stated earlier is outdated, and a later reminder, if any, supersedes this one:
    <current-time>2026-11-26T23:37:09</current-time>
    <timezone>UTC</timezone>
    </system-reminder>

(`InjectionConfig.template` wraps `<tag>value</tag>` lines for `current-time`, `timezone`,
`tasks`, `context-length`, `tool-error` and the app's `extra_fields`.) The hint stays in the
agent's context, so every later request of the episode carries it too. The current time makes
every prompt different (no reproducible episode, no prefix-cache hit across episodes), and a
small model tends to copy the block into its reply.

The gateway rewrites each incoming request before it is rendered, so the recorded prompt ids are
exactly what the model saw:

- `keep`: as sent;
- `freeze`: the `<current-time>` value becomes `FROZEN_TIME` (the rest is kept);
- `drop`: the reminder is removed (a message left empty is removed with it).

A reminder is recognized by its shape, not by the template's wording: a `<system-reminder>` block
in a non-assistant message that holds at least one runtime-state tag. AgentScope's other
reminders (a tool to call now, a budget reached, ...) carry no such tag and are never touched;
assistant messages (what the model wrote) are never touched either.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from agentscope_rft.types import JSON

RuntimeStateMode = Literal["keep", "freeze", "drop"]
RUNTIME_STATE_MODES: tuple[str, ...] = ("keep", "freeze", "drop")

FROZEN_TIME = "2025-01-01T00:00:00"
"""The `<current-time>` value `freeze` writes (AgentScope's default `time_format`)."""

STATE_TAGS = ("current-time", "timezone", "tasks", "context-length", "tool-error")
"""The tags AgentScope's runtime-state injection writes (2.0.10, `Agent._inject_runtime_state`)."""

REMINDER = re.compile(r"<system-reminder>(?:(?!</?system-reminder>).)*</system-reminder>", re.S)
"""One `<system-reminder>` block (innermost: nested markers end the match)."""
_STATE_TAG = re.compile(r"<(" + "|".join(STATE_TAGS) + r")>", re.S)
CURRENT_TIME = re.compile(r"<current-time>(.*?)</current-time>", re.S)


def is_runtime_state(block: str) -> bool:
    """Whether a `<system-reminder>` block is AgentScope's runtime-state injection.

    Example:
        >>> is_runtime_state("<system-reminder><current-time>t</current-time></system-reminder>")
        True
        >>> is_runtime_state("<system-reminder>Call the tool now.</system-reminder>")
        False
    """
    return REMINDER.fullmatch(block.strip()) is not None and _STATE_TAG.search(block) is not None


def runtime_state_blocks(messages: Sequence[JSON]) -> list[str]:
    """The runtime-state reminder blocks in a request's non-assistant messages, in order."""
    return [
        match.group(0)
        for message in messages
        if message.get("role") != "assistant"
        for text in _texts(message)
        for match in REMINDER.finditer(text)
        if is_runtime_state(match.group(0))
    ]


def apply_runtime_state(messages: list[JSON], mode: str) -> tuple[list[JSON], int]:
    """Rewrite the runtime-state reminders of a request's messages; returns (messages, how many
    reminders were frozen or dropped). The input is not modified.

    Example:
        >>> msgs = [{"role": "user", "content": "hi"},
        ...         {"role": "user", "content": "<system-reminder>Now:\\n"
        ...          "<current-time>2026-11-26T23:37:09</current-time>\\n</system-reminder>"}]
        >>> apply_runtime_state(msgs, "drop")
        ([{'role': 'user', 'content': 'hi'}], 1)
    """
    if mode not in RUNTIME_STATE_MODES:
        raise ValueError(f"unknown runtime_state mode {mode!r}: use one of keep, freeze, drop")
    if mode == "keep":
        return messages, 0
    out: list[JSON] = []
    changed = 0
    for message in messages:
        if message.get("role") == "assistant":
            out.append(message)
            continue
        rewritten, count = _rewrite(message, mode)
        changed += count
        if rewritten is not None:
            out.append(rewritten)
    if not out:  # a request of nothing but a reminder: send it as it came rather than nothing
        return messages, 0
    return out, changed


def _texts(message: JSON) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        ]
    return []


def _rewrite_text(text: str, mode: str) -> tuple[str, int]:
    count = 0

    def one(match: re.Match[str]) -> str:
        nonlocal count
        block = match.group(0)
        if not is_runtime_state(block):
            return block
        count += 1
        if mode == "drop":
            return ""
        return CURRENT_TIME.sub(f"<current-time>{FROZEN_TIME}</current-time>", block)

    new = REMINDER.sub(one, text)
    if mode == "drop" and count:
        new = re.sub(r"\n{3,}", "\n\n", new).strip()
    return new, count


def _rewrite(message: JSON, mode: str) -> tuple[JSON | None, int]:
    """The message with its reminders rewritten (None: nothing is left of it), and how many."""
    content = message.get("content")
    if isinstance(content, str):
        text, count = _rewrite_text(content, mode)
        if not count:
            return message, 0
        return (None if not text and mode == "drop" else {**message, "content": text}), count
    if not isinstance(content, list):
        return message, 0
    parts: list[object] = []
    total = 0
    for part in content:
        if (
            isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        ):
            text, count = _rewrite_text(part["text"], mode)
            total += count
            if count and not text and mode == "drop":
                continue
            parts.append({**part, "text": text} if count else part)
        else:
            parts.append(part)
    if not total:
        return message, 0
    return (None if not parts else {**message, "content": parts}), total
