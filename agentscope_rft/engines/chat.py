"""The chat layer of a tokenizer-owning engine: prompts in, parsed choices out.

`PromptBuilder` renders a request with the chat template. When the request continues an earlier
call of the same rollout and agent (same history, plus the assistant message that call returned),
it reuses that call's exact prompt and completion token ids and renders only the new turns, so
the model sees the tokens it actually sampled and consecutive calls of an episode share an exact
token prefix (trajectories then merge into one sample). `TextStream` and `assemble_choice` turn
sampled token ids into streamed content deltas and the final message.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from agentscope_rft.chat.reasoning import ReasoningStream, split_reasoning
from agentscope_rft.chat.template import (
    ChatRenderer,
    decode_text,
    normalize_messages,
    normalize_tools,
)
from agentscope_rft.chat.tools import StreamingToolParser, parse_tool_calls
from agentscope_rft.engines.base import ChatRequest, ChoiceResult, GenerationOutput
from agentscope_rft.types import JSON, ToolCall


def _assistant_key(content: str | None, tool_calls: Sequence[ToolCall] | Sequence[JSON]) -> tuple:
    calls = []
    for call in tool_calls:
        if isinstance(call, ToolCall):
            calls.append((call.name, call.arguments))
        else:
            calls.append((call["function"]["name"], call["function"]["arguments"]))
    return (content or "", tuple(calls))


_RECENT_TURNS = 4
_MAX_TURNS = 64
"""Turns kept per rollout and agent name: the newest `_RECENT_TURNS`, then the latest turn of
each other conversation (at most `_MAX_TURNS` in all)."""


def _continued(turn: _Turn, later: Sequence[_Turn]) -> set[tuple]:
    """The replies of `turn` (assistant-message keys) that a request of `later` continues."""
    k = len(turn.messages)
    keys = set()
    for other in later:
        if len(other.messages) > k and other.messages[:k] == turn.messages:
            reply = other.messages[k]
            keys.add(_assistant_key(reply.get("content"), reply.get("tool_calls", [])))
    return keys


@dataclass(slots=True)
class _Turn:
    messages: list[JSON]
    tools: list[JSON] | None
    template_kwargs: JSON | None
    full_ids: dict[tuple, list[int]]
    """assistant-message key -> prompt ids + completion ids of the choice that produced it"""


class PromptBuilder:
    """Renders requests to prompt token ids, reusing sampled tokens of earlier calls.

    Example:
        >>> builder = PromptBuilder(renderer)  # doctest: +SKIP
        >>> prompt_ids, reused = builder.build(request)  # doctest: +SKIP
    """

    def __init__(
        self, renderer: ChatRenderer, *, reuse: bool = True, max_conversations: int = 4096
    ) -> None:
        self.renderer = renderer
        self.reuse = reuse
        # A turn's end as the template writes it: a completion that ended there re-renders exactly.
        self._eos_id = renderer.end_of_turn_id
        self._eos_text = renderer.end_of_turn
        self._turns: collections.OrderedDict[tuple[str, str | None], list[_Turn]] = (
            collections.OrderedDict()
        )
        self._max = max_conversations

    def build(self, request: ChatRequest) -> tuple[list[int], int]:
        """Return (prompt ids, number of leading ids reused from an earlier call)."""
        messages = normalize_messages(request.messages)
        tools = normalize_tools(request.tools)
        kwargs = request.chat_template_kwargs
        if self.reuse and request.rollout_id is not None:
            key = (request.rollout_id, request.agent_name)
            for turn in reversed(self._turns.get(key, [])):
                ids = self._continue(turn, messages, tools, kwargs)
                if ids is not None:
                    return ids
        return self.renderer.render_ids(messages, tools, True, kwargs), 0

    def _continue(
        self, turn: _Turn, messages: list[JSON], tools: list[JSON] | None, kwargs: JSON | None
    ) -> tuple[list[int], int] | None:
        k = len(turn.messages)
        if len(messages) <= k or tools != turn.tools or messages[:k] != turn.messages:
            return None
        if (kwargs or {}) != (turn.template_kwargs or {}):
            return None  # the earlier prompt was rendered otherwise (a system turn, a switch)
        reply = messages[k]
        if reply["role"] != "assistant":
            return None
        full_ids = turn.full_ids.get(_assistant_key(reply["content"], reply.get("tool_calls", [])))
        if full_ids is None:
            return None
        # The sampled tokens stand for the reply however the template renders it now (reasoning
        # models' templates render a reply's thinking only while it is the last turn), so only
        # the history before it must render as it did; the reply's turn ends at its first end
        # of turn (a sampled reply holds none: its special tokens are not in its text).
        before = self.renderer.render_text(messages[:k], tools, False, kwargs)
        rendered = self.renderer.render_text(messages, tools, True, kwargs)
        if not rendered.startswith(before):
            return None  # the template is not append-only here
        cut = rendered.find(self._eos_text, len(before))
        if cut < 0:
            return None
        cut += len(self._eos_text)
        return full_ids + self.renderer.encode(rendered[cut:]), len(full_ids)

    def remember(
        self, request: ChatRequest, prompt_ids: list[int], choices: Sequence[ChoiceResult]
    ) -> None:
        if not self.reuse or request.rollout_id is None:
            return
        full_ids = {}
        for choice in choices:
            ends_with_eos = choice.completion_ids[-1:] == [self._eos_id]
            if ends_with_eos and choice.finish_reason in ("stop", "tool_calls"):
                full_ids[_assistant_key(choice.content, choice.tool_calls)] = (
                    prompt_ids + choice.completion_ids
                )
            elif choice.finish_reason == "length" and not ends_with_eos:
                # A reply cut at the token limit: the template closes its turn, so the next
                # prompt holds the sampled tokens, then the end of turn (a re-tokenization of a
                # cut reply, often ending inside a word or a UTF-8 character, differs from them).
                full_ids[_assistant_key(choice.content, choice.tool_calls)] = [
                    *prompt_ids,
                    *choice.completion_ids,
                    self._eos_id,
                ]
        if not full_ids:
            return
        key = (request.rollout_id, request.agent_name)
        turns = self._turns.setdefault(key, [])
        self._turns.move_to_end(key)
        turns.append(
            _Turn(
                normalize_messages(request.messages),
                normalize_tools(request.tools),
                request.chat_template_kwargs,
                full_ids,
            )
        )
        # The newest turns stay (an app may go back a turn or two), and so does the latest turn of
        # every other conversation under this key: copies of one agent running side by side (a
        # fan-out) share its name. A turn whose every reply a later turn continues is superseded.
        older = turns[:-_RECENT_TURNS]
        if older:
            later = turns[-_RECENT_TURNS:]
            leaves = [
                t
                for i, t in enumerate(older)
                if not set(t.full_ids) <= _continued(t, (*older[i + 1 :], *later))
            ]
            turns[:] = [*leaves, *later][-_MAX_TURNS:]
        while len(self._turns) > self._max:
            self._turns.popitem(last=False)

    def forget(self, rollout_id: str) -> None:
        for key in [k for k in self._turns if k[0] == rollout_id]:
            del self._turns[key]


class IncrementalDecoder:
    """Text of a growing list of token ids, one token at a time, in time linear in its length.

    Decoding all ids again at every token costs time quadratic in the completion (3 s of the event
    loop for one 4,096-token streamed reply with SmolLM2's tokenizer). As vLLM's detokenizer does,
    this decodes a window: the ids since the last emitted text but one step (`prefix`), and emits
    what they add to the text of the ids up to the last emit (`read`). The window keeps tokenizers
    that drop a word's leading space at the start of a decode exact, and a text that ends in an
    incomplete UTF-8 character waits for the next token.

    Example:
        >>> decoder = IncrementalDecoder(tokenizer)  # doctest: +SKIP
        >>> "".join(decoder.push(i) for i in ids) == decode_text(tokenizer, ids)  # doctest: +SKIP
        True
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        """The text `token_id` adds ('' while it ends in an incomplete character)."""
        self._ids.append(token_id)
        before = decode_text(self._tokenizer, self._ids[self._prefix : self._read])
        after = decode_text(self._tokenizer, self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]


class TextStream:
    """Turns one choice's tokens into content deltas that never need taking back.

    With `split_thinking` (see `chat.reasoning`), the thinking goes apart: `push` and `finish`
    return the answer's deltas and `take_reasoning` the thinking's since its last call.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        stops: Sequence[str],
        parse_tools: bool,
        *,
        split_thinking: bool = False,
        thinking_opened: bool = False,
    ):
        self._decoder = IncrementalDecoder(tokenizer)
        self._text = ""  # the choice's text so far, cut at the first stop string
        self._stopped = False
        self._fed = 0  # characters of `_text` streamed
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._stops = stops
        self._parser = StreamingToolParser() if parse_tools else None
        self._thinking = ReasoningStream(thinking_opened) if split_thinking else None
        self._reasoning = ""  # thinking not yet taken

    def _feed_text(self, text: str) -> str:
        if self._thinking is not None:
            reasoning, text = self._thinking.feed(text)
            self._reasoning += reasoning
        if self._parser is None:
            return text
        return self._parser.feed(text)

    def take_reasoning(self) -> str:
        """The thinking given since the last call ('' without `split_thinking`)."""
        out, self._reasoning = self._reasoning, ""
        return out

    def push(self, token_id: int) -> str:
        added = self._decoder.push(token_id)
        if self._stopped or not added:
            return ""
        searched = len(self._text)
        self._text += added
        for stop in self._stops:  # only where the new text can complete a stop string
            at = self._text.find(stop, max(0, searched - len(stop) + 1))
            if at >= 0:
                self._text, self._stopped = self._text[:at], True
        stable = len(self._text) - self._hold if self._stops else len(self._text)
        if stable <= self._fed:
            return ""
        new = self._text[self._fed : stable]
        self._fed = stable
        return self._feed_text(new)

    def finish(self, final_text: str) -> str:
        """The rest of the content, given the choice's final text."""
        fed = self._text[: self._fed]
        rest = final_text[len(fed) :] if final_text.startswith(fed) else ""
        out = self._feed_text(rest)
        if self._thinking is not None:
            reasoning, answer = self._thinking.finish()
            self._reasoning += reasoning
            out += self._parser.feed(answer) if self._parser is not None else answer
        if self._parser is not None:
            tail, _ = self._parser.finish()
            out += tail
        return out


def assemble_choice(
    index: int,
    output: GenerationOutput,
    tokenizer: PreTrainedTokenizerBase,
    stop_ids: set[int],
    parse_tools: bool,
    id_prefix: str,
    parallel_tool_calls: bool = True,
    *,
    split_thinking: bool = False,
    thinking_opened: bool = False,
) -> ChoiceResult:
    """Decode a choice's tokens into text, reasoning, content and tool calls (only the first call
    when not `parallel_tool_calls`).

    `split_thinking`: a `<think>...</think>` block becomes `reasoning` and content and tool calls
    come from the answer after it (`thinking_opened`: the prompt opened the block).
    """
    ids = output.completion_ids
    if ids and ids[-1] in stop_ids and output.stop_string is None:
        ids = ids[:-1]
    text = decode_text(tokenizer, ids)
    if output.stop_string is not None:
        text = text[: text.find(output.stop_string)] if output.stop_string in text else text
    reasoning, answer = None, text
    if split_thinking:
        split = split_reasoning(text, thinking_opened)
        reasoning, answer = split.reasoning, split.answer
    content: str | None = answer
    tool_calls: list[ToolCall] = []
    finish = output.finish_reason
    if parse_tools:
        parsed = parse_tool_calls(answer, id_prefix=f"{id_prefix}_{index}")
        content, tool_calls = parsed.content, parsed.tool_calls
        if not parallel_tool_calls:
            tool_calls = tool_calls[:1]
        if tool_calls and finish == "stop":
            finish = "tool_calls"
    return ChoiceResult(
        index=index,
        completion_ids=output.completion_ids,
        logprobs=output.logprobs,
        finish_reason=finish,
        policy_version=output.policy_version,
        text=text,
        content=content,
        reasoning=reasoning,
        tool_calls=tool_calls,
        top_logprobs=output.top_logprobs,
    )
