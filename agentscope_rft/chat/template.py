"""Chat-template rendering with tools.

Requests arrive in OpenAI format (content as a string or a list of parts, tool-call arguments as
JSON text). `normalize_messages` turns them into the plain shape HF chat templates expect, and
`ChatRenderer` renders and tokenizes them. The embedded model gets `HERMES_CHATML_TEMPLATE`: the
ChatML layout SmolLM2 was trained on, extended with Hermes-style tools (as in Qwen2.5):
`<tools>` schemas in the system turn, `<tool_call>{...}</tool_call>` in assistant turns, and tool
results as `<tool_response>` blocks in a user turn. The template is append-only: rendering a
conversation is a prefix of rendering any continuation of it, which trajectory merging relies on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from transformers import PreTrainedTokenizerBase

from agentscope_rft.types import JSON

HERMES_CHATML_TEMPLATE = (Path(__file__).parent / "hermes_chatml.jinja").read_text()


def decode_text(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]) -> str:
    """Text of `token_ids` without special tokens, exactly as sampled (no space clean-up)."""
    text = tokenizer.decode(
        list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    assert isinstance(text, str)
    return text


def token_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    """The text of one token on its own (special tokens included)."""
    text = tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
    assert isinstance(text, str)
    return text


class ChatFormatError(ValueError):
    """A request's messages cannot be rendered (names the offending message and field).

    `param` is the request field at fault (`messages` or `tools`), for the error body.
    """

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                texts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "refusal":
                texts.append(str(part.get("refusal", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ChatFormatError(
                    f"{where}.content[{i}]: content part of type {kind!r} is not supported by a "
                    "text-only model; send text parts"
                )
        return "".join(texts)
    raise ChatFormatError(f"{where}.content must be a string or a list of parts")


def _canonical_arguments(arguments: Any, where: str) -> str:
    """Tool-call arguments as compact-but-spaced JSON text, the way the template shows them."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            # Arguments that are not JSON are kept verbatim: the model produced them.
            return arguments
    else:
        parsed = arguments
    if not isinstance(parsed, dict):
        raise ChatFormatError(f"{where}: tool-call arguments must be a JSON object")
    return json.dumps(parsed, ensure_ascii=False)


def normalize_messages(messages: Sequence[JSON]) -> list[JSON]:
    """Return messages as `{role, content: str, tool_calls?}` for template rendering (an
    assistant message's thinking also as `reasoning` and `reasoning_content`).

    Raises:
        ChatFormatError: a message is malformed; the error names `messages[i]` and the field.

    Example:
        >>> normalize_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
        [{'role': 'user', 'content': 'hi'}]
    """
    out: list[JSON] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatFormatError(f"{where} must be an object")
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise ChatFormatError(f"{where}.role {role!r} is not one of system/user/assistant/tool")
        normalized: JSON = {"role": role, "content": _content_text(message.get("content"), where)}
        if role == "assistant":
            _add_reasoning(normalized, message, where)
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for j, call in enumerate(message["tool_calls"]):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise ChatFormatError(f"{where}.tool_calls[{j}].function.name is missing")
                calls.append(
                    {
                        "id": call.get("id", ""),
                        "type": "function",
                        "function": {
                            "name": fn["name"],
                            "arguments": _canonical_arguments(
                                fn.get("arguments", "{}"), f"{where}.tool_calls[{j}]"
                            ),
                        },
                    }
                )
            normalized["tool_calls"] = calls
        out.append(normalized)
    return out


def _add_reasoning(normalized: JSON, message: JSON, where: str) -> None:
    """An assistant message's thinking (`reasoning`, or `reasoning_content` as the responses
    carry it), as vLLM hands it to the template: as both names (Qwen3's template renders
    `reasoning_content`; a template that reads neither renders the message without it)."""
    for field in ("reasoning", "reasoning_content"):
        value = message.get(field)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ChatFormatError(f"{where}.{field} must be a string (the reply's thinking)")
        normalized["reasoning"] = normalized["reasoning_content"] = value
        return


def normalize_tools(tools: Sequence[JSON] | None) -> list[JSON] | None:
    """Validate OpenAI tool schemas; returns them unchanged (None when empty)."""
    if not tools:
        return None
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise ChatFormatError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", param="tools"
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatFormatError(f"tools[{i}].function.name is missing", param="tools")
    return list(tools)


_PROBE_REPLY = "agentscope-rft probe reply"


def end_of_turn_token(tokenizer: PreTrainedTokenizerBase, chat_template: str) -> str:
    """The special token `chat_template` closes an assistant turn with.

    It is the tokenizer's eos for most chat models, but not for all: a base model's tokenizer
    (Qwen2.5 and Qwen3 base: eos `<|endoftext|>`) used with a ChatML template ends turns with
    `<|im_end|>`. Found by rendering one assistant turn and taking the first special token after
    its content; the tokenizer's eos when the template writes none there (or cannot render it).

    Raises:
        ChatFormatError: neither exists (a reply could never end).

    Example:
        >>> end_of_turn_token(tokenizer, tokenizer.chat_template)  # doctest: +SKIP
        '<|im_end|>'
    """
    eos = tokenizer.eos_token
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _PROBE_REPLY},
    ]
    found: list[tuple[int, str]] = []
    try:
        text = tokenizer.apply_chat_template(
            conversation, chat_template=chat_template, tokenize=False
        )
    except Exception:  # a template with its own conventions (roles, system turn): use eos
        text = None
    if isinstance(text, str) and _PROBE_REPLY in text:
        tail = text[text.rindex(_PROBE_REPLY) + len(_PROBE_REPLY) :]
        special = {
            token.content for token in tokenizer.added_tokens_decoder.values() if token.special
        } | set(tokenizer.all_special_tokens)
        found = [(tail.find(token), token) for token in special if token and token in tail]
    if found:
        return min(found)[1]
    if not eos:
        raise ChatFormatError(
            "the tokenizer has no eos token and the chat template writes no special token after "
            "an assistant turn, so a reply could never end: set the tokenizer's eos_token "
            "(tokenizer_config.json) or use a chat template that closes each turn with one "
            "(model.chat_template)"
        )
    return str(eos)


class ChatRenderer:
    """Renders OpenAI-format conversations to token ids with a tokenizer's chat template.

    Example:
        >>> renderer = ChatRenderer(tokenizer)  # doctest: +SKIP
        >>> ids = renderer.render_ids([{"role": "user", "content": "2+2?"}])  # doctest: +SKIP
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise ChatFormatError(
                f"the tokenizer of {tokenizer.name_or_path} has no chat template (no "
                "chat_template.jinja, no chat_template in tokenizer_config.json): set "
                "model.chat_template (`agentscope-rft serve --chat-template`) to a .jinja file or "
                "the template text"
            )
        self.end_of_turn = end_of_turn_token(tokenizer, self.chat_template)
        """The token text closing an assistant turn (`<|im_end|>`, `<|eot_id|>`, `</s>`)."""
        end_id = tokenizer.convert_tokens_to_ids(self.end_of_turn)
        assert isinstance(end_id, int)  # one token in, one id out
        self.end_of_turn_id = end_id

    def render_text(
        self,
        messages: Sequence[JSON],
        tools: Sequence[JSON] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: JSON | None = None,
    ) -> str:
        """`template_kwargs`: more variables for the template (a request's
        `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`).

        Raises:
            ChatFormatError: the template refused the conversation (its `raise_exception`, e.g.
                Qwen3's "No user query found in messages.") or failed on it.
        """
        normalized = normalize_messages(messages)
        try:
            text = self.tokenizer.apply_chat_template(
                normalized,
                tools=normalize_tools(tools),  # type: ignore[arg-type]
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **(template_kwargs or {}),
            )
        except jinja2.TemplateError as exc:
            raise ChatFormatError(
                f"the chat template cannot render these messages: {exc} (the template is "
                "model.chat_template, else the model folder's)"
            ) from exc
        assert isinstance(text, str)
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_ids_with_mask(
        self, messages: Sequence[JSON], tools: Sequence[JSON] | None = None
    ) -> tuple[list[int], list[int]]:
        """Token ids of a whole conversation and a mask: 1 on what the assistant generates.

        Each assistant turn's span (its content/tool calls and the end-of-turn token) is tokenized
        on its own, the rest in the pieces between, exactly as the engine sees a multi-turn
        episode: a rendered prompt, the sampled completion, the rendered next turns, and so on.

        Example:
            >>> ids, mask = renderer.render_ids_with_mask(  # doctest: +SKIP
            ...     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
        """
        eos = self.end_of_turn
        ids: list[int] = []
        mask: list[int] = []
        done = 0  # characters of the full rendering already tokenized
        full = self.render_text(messages, tools, add_generation_prompt=False)
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render_text(messages[:i], tools, add_generation_prompt=True)
            upto = self.render_text(messages[: i + 1], tools, add_generation_prompt=False)
            end = upto.rfind(eos) + len(eos)
            if not full.startswith(upto[:end]) or not upto.startswith(before) or end < len(before):
                raise ChatFormatError(
                    f"messages[{i}]: the chat template is not append-only here, so assistant "
                    "turns cannot be located in the rendered conversation"
                )
            for text, value in ((full[done : len(before)], 0), (full[len(before) : end], 1)):
                piece = self.encode(text)
                ids += piece
                mask += [value] * len(piece)
            done = end
        rest = self.encode(full[done:])
        return ids + rest, mask + [0] * len(rest)

    def render_ids(
        self,
        messages: Sequence[JSON],
        tools: Sequence[JSON] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: JSON | None = None,
    ) -> list[int]:
        return self.encode(
            self.render_text(messages, tools, add_generation_prompt, template_kwargs)
        )
