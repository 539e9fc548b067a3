"""`response_format` through the real gateway on loopback, served by the embedded engine with a
tiny random model (the real tokenizer): whatever the model's logits, the mask makes the output
JSON that validates, batched beside unconstrained requests, greedy and sampled, streamed or not."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest

from agentscope_rft.data.judges import GroupJudge, JudgeClient
from agentscope_rft.data.operators import Episode, Group
from agentscope_rft.types import Sample

# The shared engines' gateways serve on the session's event loop (tests/integration/conftest.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")

SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["yes", "no", "unsure"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["verdict", "score", "ratio", "tags", "ok"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "grade", "schema": SCHEMA, "strict": True}}
ASK = [{"role": "user", "content": "Grade this answer as JSON."}]


def unattributed(gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


async def test_json_schema_output_always_validates_batched_with_free_requests(tiny_gateway):
    client = unattributed(tiny_gateway)
    constrained_before = tiny_gateway.engine.metrics()["constrained_tokens"]  # a shared engine

    def constrained(seed: int, temperature: float, n: int = 1):
        return client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=160, seed=seed, temperature=temperature,
            n=n, response_format=FORMAT,  # type: ignore[arg-type]
        )  # fmt: skip

    def free(seed: int):
        return client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=40, seed=seed, temperature=1.0
        )

    replies = await asyncio.gather(
        *(constrained(seed, 1.0, n=2) for seed in range(4)),
        constrained(0, 0.0),
        *(free(seed) for seed in range(3)),
    )
    constrained_choices = [c for r in replies[:5] for c in r.choices]
    assert len(constrained_choices) == 9
    for choice in constrained_choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    # the unconstrained requests in the same batches are free text (the random model's noise)
    free_texts = [r.choices[0].message.content or "" for r in replies[5:]]
    assert not all(_parses(text) for text in free_texts)
    assert tiny_gateway.engine.metrics()["constrained_tokens"] > constrained_before


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


async def test_json_object_gives_objects(tiny_gateway):
    # `{"type": "object"}` bounds nothing: a random model's keys and strings can run to
    # max_tokens; each choice that ends must be one JSON object.
    r = await unattributed(tiny_gateway).chat.completions.create(
        model="tiny", messages=ASK, max_tokens=48, temperature=1.0, seed=4, n=8,
        response_format={"type": "json_object"},
    )  # fmt: skip
    ended = [c.message.content or "" for c in r.choices if c.finish_reason == "stop"]
    assert ended, [c.message.content for c in r.choices]
    assert all(isinstance(json.loads(text), dict) for text in ended)
    assert all((c.message.content or "").startswith("{") for c in r.choices)


async def test_greedy_streamed_and_from_the_prefix_cache_agree(tiny_gateway):
    client = unattributed(tiny_gateway)
    kwargs = {
        "model": "tiny", "messages": ASK, "max_tokens": 160, "temperature": 0.0,
        "response_format": FORMAT,
    }  # fmt: skip
    first = await client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    text = first.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), SCHEMA)
    hits_before = tiny_gateway.engine.metrics()["prefix_cache/hit_tokens"]
    stream = await client.chat.completions.create(**kwargs, stream=True)  # type: ignore[call-overload]
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert streamed == text  # greedy: the same masked argmax, with the prompt from the cache
    assert tiny_gateway.engine.metrics()["prefix_cache/hit_tokens"] > hits_before


@pytest.mark.parametrize(
    ("response_format", "named"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
         "objekt"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}}}}, "if"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema is required"),
        ({"type": "regex", "regex": "a+"}, "'regex' is not supported"),
        ({"type": "json_schema"}, "json_schema is required"),
    ],
)  # fmt: skip
async def test_bad_response_format_is_a_400_naming_the_problem(
    tiny_gateway, response_format, named
):
    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{tiny_gateway.base_url}/chat/completions",
            json={"model": "tiny", "messages": ASK, "response_format": response_format},
        )
    assert r.status_code == 400
    error = r.json()["error"]
    assert named in error["message"] and error["param"].startswith("response_format")


async def test_training_calls_may_not_ask_for_structured_output(tiny_gateway):
    client = openai.AsyncOpenAI(
        base_url=tiny_gateway.rollout_base_url("r1"), api_key="unused", max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="m", messages=ASK, max_tokens=8,
            response_format={"type": "json_object"},
        )  # fmt: skip
    assert caught.value.code == "structured_output_in_training"
    assert "/v1/chat/completions" in caught.value.message
    assert tiny_gateway.recorder.calls("r1") == []
    # `text` is no constraint: allowed, and recorded as usual
    await client.chat.completions.create(
        model="m", messages=ASK, max_tokens=4, response_format={"type": "text"}
    )
    assert len(tiny_gateway.recorder.calls("r1")) == 1


def _episode(rid: str, response: str) -> Episode:
    sample = Sample([1, 2], [0, 1], [0.0, -0.1], 0.5, rid, "t", group_id="g", sample_id=rid)
    return Episode(rid, (sample,), response, 0.5)


async def test_the_policy_judges_with_valid_scores(tiny_gateway):
    client = JudgeClient(tiny_gateway.base_url, model="tiny", temperature=1.0, max_retries=0)
    judge = GroupJudge(client, weight=1.0)
    groups = [
        Group(f"g{k}", {"question": f"What is {k} + {k}?"},
              tuple(_episode(f"r{k}.{i}", f"It is {2 * k + i}.") for i in range(4)))
        for k in range(3)
    ]  # fmt: skip
    judged = await judge(groups)
    counters = judge.take_counters()
    assert counters["failed_groups"] == 0 and counters["failures"] == 0
    assert counters["calls"] == 3 and client.structured_output
    scores = [e.reward for g in judged for e in g.episodes]
    assert len(scores) == 12 and all(0.0 <= s <= 1.0 for s in scores)
    assert scores != [0.5] * 12  # the judge's scores replaced the rewards
    await judge.close()


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


@pytest.mark.parametrize(
    ("asked", "attributed", "sampled"),
    [
        ("required", True, "auto"),
        ({"type": "function", "function": {"name": "add"}}, True, "auto"),
        ("none", True, "none"),
        ("auto", True, "auto"),
        ("required", False, "required"),
        ({"type": "function", "function": {"name": "add"}}, False,
         {"type": "function", "function": {"name": "add"}}),
    ],
)  # fmt: skip
async def test_a_training_call_that_forces_a_tool_is_sampled_as_auto_and_counted(
    tiny_gateway, asked, attributed, sampled, monkeypatch
):
    engine = tiny_gateway.state.engine
    seen = []
    chat = engine.chat

    def spy(request):
        seen.append(request.tool_choice)
        return chat(request)

    monkeypatch.setattr(engine, "chat", spy)  # the engine is shared: undone after the test
    base = tiny_gateway.rollout_base_url("r1") if attributed else tiny_gateway.base_url
    client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
    await client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=4, tools=[ADD], tool_choice=asked
    )
    assert seen == [sampled]
    forced = attributed and sampled != asked
    assert tiny_gateway.state.counters["tool_choice_forced"] == int(forced)
    async with httpx.AsyncClient(base_url=tiny_gateway.base_url.removesuffix("/v1")) as http:
        metrics = (await http.get("/metrics")).text
    assert f"agentscope_rft_gateway_tool_choice_forced_total {int(forced)}" in metrics
