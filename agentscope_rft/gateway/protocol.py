"""OpenAI chat-completions wire format: request validation and response/SSE chunk builders.

Requests are validated strictly (unknown fields and wrong types are 400 errors that name the
field) but accept every documented OpenAI parameter, ignoring the ones that do not change what is
sampled (`user`, `metadata`, ...). Parameters that would change the sampling
distribution in ways we do not implement (penalties, logit bias) are rejected rather than silently
ignored, because training needs the exact distribution. `response_format` (structured outputs) is
checked here, so a bad schema is a 400 whichever engine serves.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agentscope_rft.engines.base import ChoiceResult
from agentscope_rft.engines.structured import grammar_for
from agentscope_rft.types import JSON, SamplingParams


class RequestError(Exception):
    """A client error with an OpenAI-style error body."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind
        self.code = code

    def body(self) -> JSON:
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    include_obfuscation: bool | None = None


class ChatCompletionRequest(BaseModel):
    """The body of `POST .../v1/chat/completions`."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=64)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # int64, as in vLLM
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's extension: more variables for the chat template (Qwen3: `enable_thinking`)."""
    parallel_tool_calls: bool | None = None
    """False: a reply hands back its first tool call only (what is sampled is unchanged)."""
    # Accepted and ignored: they do not change what is sampled.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    verbosity: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """OpenAI's API takes `null` for every optional parameter (clients send it for a value
        left unset, e.g. `n=None`): it means the default, not a wrong type."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in _DEFAULTED}
        return data

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value != 0.0:
            raise ValueError(
                "penalties are not supported: they change the sampling distribution the "
                "trainer must reproduce; send 0"
            )
        return value

    @field_validator("tool_choice")
    @classmethod
    def _known_tool_choice(
        cls, value: str | dict[str, Any] | None, info: ValidationInfo
    ) -> str | dict[str, Any] | None:
        if value is None or value in ("none", "auto"):
            return value
        names = [
            t["function"].get("name")
            for t in info.data.get("tools") or []
            if isinstance(t.get("function"), dict)
        ]
        if value == "required":
            name = None
        elif isinstance(value, dict):
            function = value.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if value.get("type") != "function" or not isinstance(name, str):
                raise ValueError(
                    "must be 'none', 'auto', 'required' or "
                    '{"type": "function", "function": {"name": ...}}'
                )
        else:
            raise ValueError(f"{value!r} is not one of 'none', 'auto', 'required'")
        if not names:
            raise ValueError("forces a tool call, but the request has no tools")
        if name is not None and name not in names:
            raise ValueError(f"names the function {name!r}, which is not among the tools {names}")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(set(value or {}) & _RENDER_ARGUMENTS)
        if taken:
            raise ValueError(
                f"{', '.join(taken)} cannot be set here: the gateway sets them when it renders "
                'the prompt; send only the template\'s own variables, e.g. {"enable_thinking": '
                "false}"
            )
        return value

    @field_validator("stop")
    @classmethod
    def _few_stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 8 or any(not s for s in stops):
            raise ValueError("stop must be at most 8 non-empty strings")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError(
                "logit_bias is not supported: it changes the sampling distribution the trainer "
                "must reproduce; leave it out (or send {}); to keep tokens out, use stop strings "
                "or response_format"
            )
        return value

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        grammar_for(value)  # raises ValueError naming what is wrong
        return value

    @property
    def constraint(self) -> dict[str, Any] | None:
        """The `response_format` that constrains sampling (None for none or `text`)."""
        if self.response_format is None or self.response_format.get("type") == "text":
            return None
        return self.response_format

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value and set(value) != {"text"}:
            raise ValueError("only the 'text' modality is supported")
        return value

    def sampling(
        self, defaults: JSON | None = None, overrides: JSON | None = None
    ) -> SamplingParams:
        """Sampling settings: request values, then `defaults` for unset ones, then `overrides`.

        `overrides` may carry `seed_default` (a seed when none is set) and `max_tokens_limit`
        (a cap on `max_tokens`, which applies also when the request sets none).
        """
        values: JSON = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_completion_tokens or self.max_tokens,
            "seed": self.seed,
        }
        values = {k: v for k, v in values.items() if v is not None}
        for key, value in (defaults or {}).items():
            values.setdefault(key, value)
        overrides = dict(overrides or {})
        seed_default = overrides.pop("seed_default", None)
        if seed_default is not None:
            values.setdefault("seed", seed_default)
        limit = overrides.pop("max_tokens_limit", None)
        values.update({k: v for k, v in overrides.items() if v is not None})
        if limit is not None:
            values["max_tokens"] = min(values.get("max_tokens") or limit, limit)
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        try:
            return SamplingParams(
                stop=tuple(stop),
                n=self.n,
                top_logprobs=(self.top_logprobs or 0) if self.logprobs else 0,
                ignore_eos=self.ignore_eos,
                **values,
            )
        except ValueError as exc:
            raise RequestError(str(exc)) from exc


_RENDER_ARGUMENTS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""`apply_chat_template`'s own arguments: not variables a request may pass to the template."""

_DEFAULTED = frozenset(
    name
    for name, info in ChatCompletionRequest.model_fields.items()
    if not info.is_required() and info.default is not None
)
"""Parameters whose default is not None: a `null` for them means that default."""


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any, where: str) -> tuple[str, str] | None:
    """The first string (key or value) in `value` that holds half a UTF-16 surrogate pair, as
    (where, the half): JSON decodes a pair to one character, so any surrogate left is alone."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        return (where, found.group()) if found else None
    items: Any = ()
    if isinstance(value, dict):
        for key in value:
            if found := _SURROGATE.search(key):
                return f"{where or 'the body'} (a key)", found.group()
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    for path, item in items:
        hit = _lone_surrogate(item, path)
        if hit is not None:
            return hit
    return None


def _check_unicode(body: bytes, data: dict[str, Any]) -> None:
    """A 400 naming the string that holds a lone surrogate (`"\\ud83d"` escaped alone): no
    tokenizer takes it (it was a 500)."""
    if not _SURROGATE_ESCAPE.search(body):
        return
    hit = _lone_surrogate(data, "")
    if hit is not None:
        where, half = hit
        escaped = half.encode("unicode_escape").decode()
        raise RequestError(
            f"{where} holds half a UTF-16 surrogate pair ({escaped}) without its other half, "
            "which is not Unicode text (no tokenizer takes it): send the whole character (both "
            "halves, or the character itself in UTF-8) or drop it",
            param=None if where.startswith("the body") else re.split(r"[.\[ ]", where)[0],
        )


def parse_request(body: bytes) -> ChatCompletionRequest:
    """Parse and validate a request body; raises `RequestError` naming the problem.

    Example:
        >>> parse_request(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}').n
        1
    """
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise RequestError("the request body is not valid JSON: nested too deeply") from exc
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    _check_unicode(body, data)
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        problems = []
        first_param = None
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "body"
            first_param = first_param or where
            message = error["msg"]
            if error["type"] == "extra_forbidden":
                message = "unknown field (not an OpenAI chat-completions parameter)"
            elif error["type"] == "missing":
                message = "required field is missing"
            problems.append(f"{where}: {message}")
        raise RequestError("invalid request: " + "; ".join(problems), param=first_param) from exc


def _message(choice: ChoiceResult) -> JSON:
    message: JSON = {"role": "assistant", "content": choice.content}
    if choice.reasoning is not None:
        message["reasoning_content"] = choice.reasoning  # DeepSeek's and vLLM's field
    if choice.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in choice.tool_calls
        ]
    return message


def logprobs_content(
    choice: ChoiceResult, token_texts: Sequence[str], top_texts: Sequence[Sequence[str]] | None
) -> JSON:
    """OpenAI `logprobs` object for the tokens the client sees (`token_texts` aligned)."""
    content = []
    for k, text in enumerate(token_texts):
        entry: JSON = {
            "token": text,
            "logprob": choice.logprobs[k],
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": [],
        }
        if choice.top_logprobs is not None and top_texts is not None:
            entry["top_logprobs"] = [
                {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
                for t, (_, lp) in zip(top_texts[k], choice.top_logprobs[k], strict=True)
            ]
        content.append(entry)
    return {"content": content, "refusal": None}


def usage(prompt_tokens: int, choices: Sequence[ChoiceResult]) -> JSON:
    completion = sum(len(c.completion_ids) for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def completion_body(
    request_id: str,
    model: str,
    prompt_ids: list[int],
    choices: Sequence[ChoiceResult],
    logprobs: Sequence[JSON | None],
    return_token_ids: bool,
) -> JSON:
    body: JSON = {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": choice.index,
                "message": _message(choice),
                "logprobs": logprobs[i],
                "finish_reason": choice.finish_reason,
                **({"token_ids": choice.completion_ids} if return_token_ids else {}),
            }
            for i, choice in enumerate(choices)
        ],
        "usage": usage(len(prompt_ids), choices),
    }
    if return_token_ids:
        body["prompt_token_ids"] = prompt_ids
    return body


class ChunkWriter:
    """Builds SSE `chat.completion.chunk` events for one streamed request."""

    def __init__(self, request_id: str, model: str) -> None:
        self._base: JSON = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def event(
        self,
        index: int,
        delta: JSON,
        finish_reason: str | None = None,
        logprobs: JSON | None = None,
        extra: JSON | None = None,
    ) -> str:
        choice: JSON = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        if extra:
            choice.update(extra)
        return self._sse({**self._base, "choices": [choice]})

    def role(self, index: int) -> str:
        return self.event(index, {"role": "assistant", "content": ""})

    def content(self, index: int, text: str) -> str:
        return self.event(index, {"content": text})

    def reasoning(self, index: int, text: str) -> str:
        return self.event(index, {"reasoning_content": text})

    def finish(self, choice: ChoiceResult, logprobs: JSON | None, return_token_ids: bool) -> str:
        delta: JSON = {}
        if choice.tool_calls:
            delta["tool_calls"] = [
                {
                    "index": k,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for k, call in enumerate(choice.tool_calls)
            ]
        extra = {"token_ids": choice.completion_ids} if return_token_ids else None
        return self.event(choice.index, delta, choice.finish_reason, logprobs, extra)

    def usage(self, body: JSON, prompt_ids: list[int] | None) -> str:
        chunk: JSON = {**self._base, "choices": [], "usage": body}
        if prompt_ids is not None:
            chunk["prompt_token_ids"] = prompt_ids
        return self._sse(chunk)

    @staticmethod
    def error(error: RequestError) -> str:
        return ChunkWriter._sse(error.body())

    @staticmethod
    def _sse(data: JSON) -> str:
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

    @staticmethod
    def done() -> str:
        return "data: [DONE]\n\n"


def models_body(model: str, created: int) -> JSON:
    return {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": created, "owned_by": "agentscope-rft"}
        ],
    }
