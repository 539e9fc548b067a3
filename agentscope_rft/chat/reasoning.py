"""Reasoning ("thinking") text of models that write `<think>...</think>` before their answer.

Qwen3, QwQ and DeepSeek-R1 style models sample their reasoning as ordinary text between
`<think>` and `</think>` (DeepSeek-R1's template opens the block in the generation prompt, so the
completion starts inside it). With `engine.reasoning_parser` on, the engines split that text off:
the OpenAI response carries it as `reasoning_content` (AgentScope makes it a `ThinkingBlock`) and
`content` holds the answer alone, so answer and tool-call parsers never see the thinking. The
training sample is untouched: it holds the sampled tokens, thinking included.

Split rules (the same for whole texts and for streams, so streamed deltas add up to the
non-streamed fields exactly):

- the completion is inside a think block when it starts with `<think>` (leading whitespace
  allowed) or the prompt ended with an open one; otherwise it is all answer;
- inside a block, everything up to the first `</think>` is reasoning (all of it when the reply was
  cut before `</think>`), newlines around it dropped; the answer is the rest, leading whitespace
  dropped (Qwen3 writes `</think>\\n\\n` before its answer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

ReasoningParser = Literal["auto", "none", "think"]


@dataclass(frozen=True, slots=True)
class SplitReply:
    reasoning: str | None
    """The thinking (None: the reply had no think block)."""
    answer: str


def split_reasoning(text: str, opened: bool = False) -> SplitReply:
    """Split a completion's text into its thinking and its answer.

    `opened`: the prompt ended inside a think block (DeepSeek-R1's generation prompt).

    Example:
        >>> split_reasoning("<think>\\n2+2 is 4.\\n</think>\\n\\nThe answer is 4.")
        SplitReply(reasoning='2+2 is 4.', answer='The answer is 4.')
        >>> split_reasoning("2+2 is 4.</think>4", opened=True)
        SplitReply(reasoning='2+2 is 4.', answer='4')
        >>> split_reasoning("No thinking here.")
        SplitReply(reasoning=None, answer='No thinking here.')
    """
    body_at = _body_start(text, opened)
    if body_at is None:
        return SplitReply(None, text)
    close = text.find(THINK_CLOSE, body_at)
    if close < 0:
        return SplitReply(text[body_at:].strip("\n"), "")
    return SplitReply(text[body_at:close].strip("\n"), text[close + len(THINK_CLOSE) :].lstrip())


def _body_start(text: str, opened: bool) -> int | None:
    """Where the thinking starts in `text`; None when `text` has no think block."""
    if opened:
        return 0
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN):
        return None
    return len(text) - len(stripped) + len(THINK_OPEN)


class ReasoningStream:
    """Incremental twin of `split_reasoning`: text in, (reasoning, answer) deltas out.

    A delta is given only when no later text can change it: the start waits until it is known
    whether a think block opens, a suffix that may begin `</think>` and trailing newlines of the
    thinking wait for what follows, and so does whitespace before the answer.

    Example:
        >>> stream = ReasoningStream()
        >>> stream.feed("<thi"), stream.feed("nk>\\nHm.\\n</th"), stream.feed("ink>\\n\\nYes")
        (('', ''), ('Hm.', ''), ('', 'Yes'))
        >>> stream.finish()
        ('', '')
    """

    def __init__(self, opened: bool = False) -> None:
        self._text = ""
        self._body_at: int | None = 0 if opened else None
        self._decided = opened
        self._close_at: int | None = None
        self._searched = 0  # characters of `_text` searched for `</think>`
        self._reasoning_sent = 0  # characters of the final reasoning already given
        self._answer_sent = 0

    def feed(self, delta: str) -> tuple[str, str]:
        self._text += delta
        return self._emit(final=False)

    def finish(self) -> tuple[str, str]:
        return self._emit(final=True)

    def _emit(self, *, final: bool) -> tuple[str, str]:
        text = self._text
        if not self._decided:
            stripped = text.lstrip()
            if not final and THINK_OPEN.startswith(stripped):
                return "", ""  # may still become `<think>`
            self._decided = True
            self._body_at = _body_start(text, False)
        if self._body_at is None:
            return "", self._take_answer(text)
        if self._close_at is None:
            # only where the new text can complete the tag
            close = text.find(THINK_CLOSE, max(self._body_at, self._searched - len(THINK_CLOSE)))
            self._searched = len(text)
            if close >= 0:
                self._close_at = close
        if self._close_at is None:
            body = text[self._body_at :]
            if not final:
                body = _without_partial_tag(body).rstrip("\n")
            return self._take_reasoning(body.lstrip("\n")), ""
        reasoning = self._take_reasoning(text[self._body_at : self._close_at].strip("\n"))
        answer = text[self._close_at + len(THINK_CLOSE) :].lstrip()
        return reasoning, self._take_answer(answer)

    def _take_reasoning(self, reasoning: str) -> str:
        out = reasoning[self._reasoning_sent :]
        self._reasoning_sent = max(self._reasoning_sent, len(reasoning))
        return out

    def _take_answer(self, answer: str) -> str:
        out = answer[self._answer_sent :]
        self._answer_sent = max(self._answer_sent, len(answer))
        return out


def _without_partial_tag(body: str) -> str:
    """`body` without a suffix that may be the start of `</think>`."""
    for k in range(min(len(THINK_CLOSE) - 1, len(body)), 0, -1):
        if THINK_CLOSE.startswith(body[-k:]):
            return body[:-k]
    return body


def prompt_opens_thinking(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> bool:
    """Whether the prompt ends inside an open think block (DeepSeek-R1's generation prompt).

    Example:
        >>> prompt_opens_thinking(tokenizer, prompt_ids)  # doctest: +SKIP
        False
    """
    tail = tokenizer.decode(prompt_ids[-16:], clean_up_tokenization_spaces=False)
    assert isinstance(tail, str)
    tail = tail.rstrip()
    return tail.endswith(THINK_OPEN)


def resolve_reasoning_parser(
    parser: ReasoningParser, chat_template: str, tokenizer: PreTrainedTokenizerBase
) -> bool:
    """Whether to split thinking off replies: `think` yes, `none` no, `auto` when the chat
    template knows `</think>` (logged). `think` with a template that never mentions `</think>`
    is allowed (a model fine-tuned to think) but warned about.

    Example:
        >>> resolve_reasoning_parser("none", "{{ messages }}", tokenizer)  # doctest: +SKIP
        False
    """
    knows = THINK_CLOSE in chat_template
    if parser == "none":
        return False
    if parser == "auto":
        if knows:
            logger.info(
                "engine.reasoning_parser: auto -> think (the chat template of %s writes "
                "</think>): replies' <think>...</think> text is returned as reasoning_content; "
                "set engine.reasoning_parser: none to keep it in the content",
                tokenizer.name_or_path,
            )
        return knows
    if not knows:
        logger.warning(
            "engine.reasoning_parser: think, but the chat template of %s never writes %s: "
            "replies that do not start with <think> are returned unchanged; if this model "
            "does not think, set engine.reasoning_parser: none (or auto)",
            tokenizer.name_or_path,
            THINK_CLOSE,
        )
    return True
