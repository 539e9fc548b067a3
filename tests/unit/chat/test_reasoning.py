"""Splitting `<think>...</think>` off replies: whole texts, streams cut anywhere, the switch."""

from __future__ import annotations

import logging
import random

import pytest

from agentscope_rft.chat.reasoning import (
    ReasoningStream,
    SplitReply,
    resolve_reasoning_parser,
    split_reasoning,
)
from agentscope_rft.models import TINY_MODEL, load_tokenizer, resolve_model
from tests.thinking_template import QWEN3_LIKE

CASES = [
    # (text, prompt opened a think block, reasoning, answer)
    ("<think>\nLet me add.\n</think>\n\nIt is 4.", False, "Let me add.", "It is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("<think>\n\n</think>\n\nQuick.", False, "", "Quick."),
    ("<think>\ncut before the end", False, "cut before the end", ""),
    ("No thinking. </think> stays.", False, None, "No thinking. </think> stays."),
    ("I <think> later", False, None, "I <think> later"),
    ("opened in the prompt\n</think>\nok", True, "opened in the prompt", "ok"),
    ("opened, never closed", True, "opened, never closed", ""),
    ("<think>x</think>y</think>z", False, "x", "y</think>z"),
    ("<think>\nline\n\n</think>", False, "line", ""),
    ("", False, None, ""),
    ("", True, "", ""),
]


@pytest.mark.parametrize(("text", "opened", "reasoning", "answer"), CASES)
def test_split(text, opened, reasoning, answer):
    assert split_reasoning(text, opened) == SplitReply(reasoning, answer)


@pytest.mark.parametrize(("text", "opened", "reasoning", "answer"), CASES)
def test_streams_cut_anywhere_add_up_to_the_split(text, opened, reasoning, answer):
    rng = random.Random(text)
    for _ in range(30):
        stream = ReasoningStream(opened)
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randrange(1, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
        assert "".join(r for r, _ in deltas) == (reasoning or "")
        assert "".join(a for _, a in deltas) == answer


def test_a_stream_gives_thinking_and_answer_as_they_come():
    stream = ReasoningStream()
    assert stream.feed("<think>\nStep one") == ("Step one", "")
    assert stream.feed(".\n</thi") == (".", "")  # a partial tag and newlines wait
    assert stream.feed("nk>\n\nDone") == ("", "Done")
    assert stream.feed(" now.") == ("", " now.")
    assert stream.finish() == ("", "")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(TINY_MODEL))


def test_auto_follows_the_template_and_says_so(tokenizer, caplog):
    caplog.set_level(logging.INFO, "agentscope_rft.chat.reasoning")
    assert resolve_reasoning_parser("auto", QWEN3_LIKE, tokenizer) is True
    assert "auto -> think" in caplog.text
    assert resolve_reasoning_parser("auto", tokenizer.chat_template, tokenizer) is False
    assert resolve_reasoning_parser("none", QWEN3_LIKE, tokenizer) is False


def test_think_on_a_template_without_think_tags_warns_with_the_fix(tokenizer, caplog):
    caplog.set_level(logging.WARNING, "agentscope_rft.chat.reasoning")
    assert resolve_reasoning_parser("think", tokenizer.chat_template, tokenizer) is True
    [record] = caplog.records
    assert "never writes </think>" in record.message
    assert "engine.reasoning_parser: none" in record.message
