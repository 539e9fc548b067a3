"""`gateway.runtime_state`: AgentScope's runtime-state reminder kept, frozen or dropped."""

from __future__ import annotations

import pytest

from agentscope_rft.config import ConfigError, load_config
from agentscope_rft.gateway.runtime_state import (
    FROZEN_TIME,
    apply_runtime_state,
    is_runtime_state,
    runtime_state_blocks,
)

# AgentScope 2.0.10's InjectionConfig.template with a time and timezone, as its formatter sends it
REMINDER = (
    "<system-reminder>Treat the following as the ground truth at this point of the conversation. "
    "Anything stated earlier is outdated, and a later reminder, if any, supersedes this one:\n"
    "<current-time>2026-11-26T23:37:09</current-time>\n<timezone>UTC</timezone>\n"
    "</system-reminder>"
)
OTHER = "<system-reminder>Now you **MUST** call the tool named `x`.</system-reminder>"


def conversation(reminder: str = REMINDER) -> list[dict]:
    return [
        {"role": "system", "name": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "name": "user", "content": [{"type": "text", "text": "How many?"}]},
        {"role": "user", "content": [{"type": "text", "text": reminder}]},
        {"role": "assistant", "name": "a", "content": [{"type": "text", "text": REMINDER}]},
    ]


def test_keep_sends_the_messages_unchanged():
    messages = conversation()
    assert apply_runtime_state(messages, "keep") == (messages, 0)


def test_drop_removes_the_reminder_message_and_keeps_what_the_model_wrote():
    messages = conversation()
    dropped, count = apply_runtime_state(messages, "drop")
    assert count == 1
    assert dropped == [messages[0], messages[1], messages[3]]  # the assistant's echo stays
    assert messages == conversation()  # the input is not modified


def test_freeze_replaces_only_the_time():
    frozen, count = apply_runtime_state(conversation(), "freeze")
    text = frozen[2]["content"][0]["text"]
    assert count == 1
    assert text == REMINDER.replace("2026-11-26T23:37:09", FROZEN_TIME)
    later = REMINDER.replace("23:37:09", "23:59:58")
    assert apply_runtime_state(conversation(later), "freeze")[0] == frozen  # prompts repeat


def test_a_reminder_inside_a_longer_text_or_a_string_content_is_found():
    text = f"History:\nuser: hi\n{REMINDER}\nassistant: hello"
    messages = [{"role": "user", "content": text}]
    dropped, count = apply_runtime_state(messages, "drop")
    assert count == 1 and dropped[0]["content"] == "History:\nuser: hi\n\nassistant: hello"
    frozen, _ = apply_runtime_state(messages, "freeze")
    assert FROZEN_TIME in frozen[0]["content"] and "23:37:09" not in frozen[0]["content"]


def test_other_reminders_and_custom_templates():
    assert not is_runtime_state(OTHER)
    assert apply_runtime_state(conversation(OTHER), "drop") == (conversation(OTHER), 0)
    # a custom InjectionConfig.template: recognized by its runtime-state tags, not its words
    custom = "<system-reminder>State:\n<tasks>You have 1 pending task.</tasks>\n</system-reminder>"
    assert is_runtime_state(custom)
    assert apply_runtime_state(conversation(custom), "drop")[1] == 1
    assert runtime_state_blocks(conversation()) == [REMINDER]  # not the assistant's copy


def test_a_request_of_nothing_but_a_reminder_is_sent_as_it_came():
    messages = [{"role": "user", "content": REMINDER}]
    assert apply_runtime_state(messages, "drop") == (messages, 0)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="keep, freeze, drop"):
        apply_runtime_state(conversation(), "strip")
    with pytest.raises(ConfigError, match=r"gateway\.runtime_state"):
        load_config(None, ["workflow=x.py:run", "gateway.runtime_state=strip"])
