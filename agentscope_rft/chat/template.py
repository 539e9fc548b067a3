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
from typing import Any

from transformers import PreTrainedTokenizerBase

from agentscope_rft.types import JSON

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

HERMES_CHATML_TEMPLATE = (
    "{%- set default_system = '" + DEFAULT_SYSTEM_PROMPT + "' -%}\n"
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "  {%- set system_text = messages[0]['content'] -%}\n"
    "  {%- set rest = messages[1:] -%}\n"
    "{%- else -%}\n"
    "  {%- set system_text = default_system -%}\n"
    "  {%- set rest = messages -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_start|>system\\n' + system_text -}}\n"
    "{%- if tools -%}\n"
    "  {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}\n"
    "  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}\n"
    "  {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>\' -}}\n'
    "{%- endif -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- for message in rest -%}\n"
    "  {%- if message['role'] == 'tool' -%}\n"
    "    {%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{- '<|im_start|>user' -}}{%- endif -%}\n"
    "    {{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}\n"
    "    {%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}\n"
    "  {%- elif message['role'] == 'assistant' -%}\n"
    "    {{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}\n"
    "    {%- for call in message.get('tool_calls') or [] -%}\n"
    "      {%- if loop.first and message['content'] -%}{{- '\\n' -}}{%- endif -%}\n"
    "      {%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}\n"
    '      {{- \'<tool_call>\\n{"name": "\' + call[\'function\'][\'name\'] + \'", "arguments": \' '
    "+ call['function']['arguments'] + '}\\n</tool_call>' -}}\n"
    "    {%- endfor -%}\n"
    "    {{- '<|im_end|>\\n' -}}\n"
    "  {%- else -%}\n"
    "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
)


class ChatFormatError(ValueError):
    """A request's messages cannot be rendered (names the offending message and field)."""


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
    """Return messages as `{role, content: str, tool_calls?}` for template rendering.

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


def normalize_tools(tools: Sequence[JSON] | None) -> list[JSON] | None:
    """Validate OpenAI tool schemas; returns them unchanged (None when empty)."""
    if not tools:
        return None
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ChatFormatError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatFormatError(f"tools[{i}].function.name is missing")
    return list(tools)


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
            raise ChatFormatError("the tokenizer has no chat template; set model.chat_template")

    def render_text(
        self,
        messages: Sequence[JSON],
        tools: Sequence[JSON] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            normalize_messages(messages),
            tools=normalize_tools(tools),
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        assert isinstance(text, str)
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_ids(
        self,
        messages: Sequence[JSON],
        tools: Sequence[JSON] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        return self.encode(self.render_text(messages, tools, add_generation_prompt))
