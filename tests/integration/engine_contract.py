"""The engine contract as executable checks: every engine (embedded, vLLM) must pass them all.

Each `check_*` takes a started engine and asserts one part of `agentscope_rft.engines.base`
through the protocol only (no engine internals), so recorded calls look the same whichever
engine made them. `run_contract` runs them in order. Prompts are short and English so that
greedy SmolLM2 or a tiny random model answer in ASCII (token texts then join to the text).

Example:
    >>> await run_contract(engine, weights=model_dir)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agentscope_rft.engines.base import (
    ChatEvent,
    ChatRequest,
    ChoiceDone,
    ChoiceResult,
    ContentDelta,
    ContextWindowError,
    Engine,
    EngineError,
    PromptReady,
)
from agentscope_rft.types import SamplingParams

QUESTION = [{"role": "user", "content": "Name three colors."}]


async def collect(engine: Engine, request: ChatRequest) -> list[ChatEvent]:
    return [event async for event in engine.chat(request)]


def choices_of(events: list[ChatEvent]) -> list[ChoiceResult]:
    return [e.choice for e in events if isinstance(e, ChoiceDone)]


def request(
    messages: list[dict] | None = None,
    *,
    stream: bool = False,
    rollout_id: str | None = None,
    **sampling: object,
) -> ChatRequest:
    params = {"temperature": 0.0, "max_tokens": 24, **sampling}
    return ChatRequest(
        messages=messages or QUESTION,
        sampling=SamplingParams(**params),  # type: ignore[arg-type]  # test helper
        stream=stream,
        rollout_id=rollout_id,
    )


def check_identity(engine: Engine) -> None:
    assert isinstance(engine, Engine)
    assert engine.model_name
    assert isinstance(engine.policy_version, int)
    assert engine.max_model_len > 0


def check_choice(engine: Engine, choice: ChoiceResult, max_tokens: int) -> None:
    """Ids and log-probs line up, are real log-probs, and decode to the returned text."""
    ids = choice.completion_ids
    assert 1 <= len(ids) <= max_tokens
    assert len(choice.logprobs) == len(ids)
    assert all(math.isfinite(lp) and lp <= 1e-6 for lp in choice.logprobs)
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.policy_version == engine.policy_version
    if choice.finish_reason == "length":
        assert len(ids) == max_tokens
        text_ids = ids
    else:
        text_ids = ids[:-1]  # the end-of-sequence token the model sampled is recorded too
    joined = "".join(engine.token_texts(text_ids))
    if joined.isascii():
        assert joined == choice.text
    if not choice.tool_calls:
        assert choice.content == choice.text


async def check_chat_events(engine: Engine) -> ChoiceResult:
    """PromptReady first, then one ChoiceDone per choice; no deltas unless streaming."""
    events = await collect(engine, request())
    assert isinstance(events[0], PromptReady)
    assert len(events[0].prompt_ids) > 0
    assert not any(isinstance(e, ContentDelta) for e in events)
    choices = choices_of(events)
    assert [c.index for c in choices] == [0]
    check_choice(engine, choices[0], 24)
    return choices[0]


async def check_greedy_repeatable_and_generate(engine: Engine) -> None:
    """Greedy chat is repeatable, and `generate` on the chat's prompt ids samples the same."""
    first = await collect(engine, request())
    second = await collect(engine, request())
    prompt = first[0]
    assert isinstance(prompt, PromptReady)
    a, b = choices_of(first)[0], choices_of(second)[0]
    assert a.completion_ids == b.completion_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
    [out] = await engine.generate(prompt.prompt_ids, SamplingParams(temperature=0.0, max_tokens=24))
    assert out.completion_ids == a.completion_ids
    assert out.logprobs == pytest.approx(a.logprobs, abs=1e-3)
    assert out.policy_version == engine.policy_version


async def check_stream_agrees(engine: Engine) -> None:
    """Streamed and non-streamed seeded calls give the same tokens; deltas add up to content."""
    kwargs = {"temperature": 1.0, "seed": 7, "max_tokens": 32}
    plain = choices_of(await collect(engine, request(**kwargs)))[0]
    events = await collect(engine, request(stream=True, **kwargs))
    streamed = choices_of(events)[0]
    assert streamed.completion_ids == plain.completion_ids
    assert streamed.logprobs == pytest.approx(plain.logprobs, abs=1e-3)
    assert streamed.text == plain.text
    done_at = next(i for i, e in enumerate(events) if isinstance(e, ChoiceDone))
    deltas = [e for e in events if isinstance(e, ContentDelta)]
    assert all(events.index(d) < done_at for d in deltas)
    assert "".join(d.text for d in deltas) == (streamed.content or "")


async def check_n_choices(engine: Engine) -> None:
    events = await collect(engine, request(temperature=1.0, seed=3, n=3, max_tokens=12))
    assert sum(isinstance(e, PromptReady) for e in events) == 1
    choices = choices_of(events)
    assert sorted(c.index for c in choices) == [0, 1, 2]
    for choice in choices:
        check_choice(engine, choice, 12)


async def check_top_logprobs(engine: Engine) -> None:
    choice = choices_of(await collect(engine, request(top_logprobs=3, max_tokens=8)))[0]
    assert choice.top_logprobs is not None
    assert len(choice.top_logprobs) == len(choice.completion_ids)
    for row, token, logprob in zip(
        choice.top_logprobs, choice.completion_ids, choice.logprobs, strict=True
    ):
        assert len(row) == 3
        values = [lp for _, lp in row]
        assert values == sorted(values, reverse=True)
        # greedy: the sampled token is a most likely one (bf16 logits can tie)
        assert logprob == pytest.approx(row[0][1], abs=1e-6)
        assert token in [t for t, lp in row if lp == pytest.approx(row[0][1], abs=1e-6)]
        assert row[0][1] == pytest.approx(logprob, abs=1e-4)


async def check_errors(engine: Engine) -> None:
    """Client mistakes are EngineErrors with a 4xx status; too-long prompts a ContextWindowError."""
    long = [{"role": "user", "content": "word " * (engine.max_model_len + 10)}]
    with pytest.raises(ContextWindowError) as too_long:
        await collect(engine, request(long))
    assert too_long.value.status == 400
    with pytest.raises(EngineError) as bad_role:
        await collect(engine, request([{"role": "wizard", "content": "hi"}]))
    assert 400 <= bad_role.value.status < 500


async def check_prompt_reuse(engine: Engine) -> None:
    """A rollout's next call starts with the exact ids of the previous prompt and completion."""
    first_events = await collect(engine, request(rollout_id="contract-r1", max_tokens=48))
    prompt = first_events[0]
    assert isinstance(prompt, PromptReady)
    first = choices_of(first_events)[0]
    if first.finish_reason != "stop":
        pytest.skip("the model did not finish its answer within 48 tokens")
    follow_up = [
        *QUESTION,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "And three more?"},
    ]
    second = await collect(engine, request(follow_up, rollout_id="contract-r1"))
    assert isinstance(second[0], PromptReady)
    prefix = prompt.prompt_ids + first.completion_ids
    assert second[0].prompt_ids[: len(prefix)] == prefix


async def check_load_weights(engine: Engine, weights: Path) -> None:
    """Reloading the same weights as a new version keeps outputs and bumps the version."""
    before = choices_of(await collect(engine, request()))[0]
    version = engine.policy_version + 1
    seconds = await engine.load_weights(weights, version)
    assert seconds > 0
    assert engine.policy_version == version
    after = choices_of(await collect(engine, request()))[0]
    assert after.policy_version == version
    assert after.completion_ids == before.completion_ids
    assert after.logprobs == pytest.approx(before.logprobs, abs=1e-3)


async def run_contract(engine: Engine, *, weights: Path, exact_prompt_reuse: bool = True) -> None:
    check_identity(engine)
    await check_chat_events(engine)
    await check_greedy_repeatable_and_generate(engine)
    await check_stream_agrees(engine)
    await check_n_choices(engine)
    await check_top_logprobs(engine)
    await check_errors(engine)
    if exact_prompt_reuse:
        await check_prompt_reuse(engine)
    await check_load_weights(engine, weights)
