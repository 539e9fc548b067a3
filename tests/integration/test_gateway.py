"""The gateway on loopback with the real openai client: formats, recording, and bad input."""

import asyncio
import json

import httpx
import openai
import pytest

from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.gateway.server import Gateway

# The shared engines' gateways serve on the session's event loop (tests/integration/conftest.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")

HI = [{"role": "user", "content": "Say hi"}]


def client(gateway, rollout="r1", api_key="unused"):
    return openai.AsyncOpenAI(
        base_url=gateway.rollout_base_url(rollout), api_key=api_key, max_retries=0
    )


async def test_non_streaming_with_logprobs_and_token_ids(tiny_gateway):
    r = await client(tiny_gateway).chat.completions.create(
        model="anything",
        messages=HI,
        max_tokens=8,
        seed=1,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    [call] = tiny_gateway.recorder.calls("r1")
    assert choice.token_ids == call.completion_ids  # type: ignore[attr-defined]
    assert r.prompt_token_ids == call.prompt_ids  # type: ignore[attr-defined]
    assert [t.logprob for t in choice.logprobs.content] == call.logprobs
    assert all(len(t.top_logprobs) == 3 for t in choice.logprobs.content)
    assert r.usage.completion_tokens == len(call.completion_ids)
    assert r.usage.prompt_tokens == len(call.prompt_ids)
    assert call.policy_version == 0 and call.rollout_id == "r1"


async def test_client_gets_only_what_it_asked_for(tiny_gateway):
    r = await client(tiny_gateway).chat.completions.create(model="m", messages=HI, max_tokens=4)
    raw = r.model_dump()
    assert raw["choices"][0]["logprobs"] is None
    assert "token_ids" not in raw["choices"][0] and "prompt_token_ids" not in raw
    # ...while the recorder has everything
    [call] = tiny_gateway.recorder.calls("r1")
    assert len(call.logprobs) == len(call.completion_ids) > 0


async def test_streamed_and_non_streamed_records_agree(tiny_gateway):
    kwargs = {"model": "m", "messages": HI, "max_tokens": 12, "seed": 7, "temperature": 1.0}
    plain = await client(tiny_gateway, "a").chat.completions.create(**kwargs)
    stream = await client(tiny_gateway, "b").chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    text, usage, finish = "", None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    [a], [b] = tiny_gateway.recorder.calls("a"), tiny_gateway.recorder.calls("b")
    assert (a.prompt_ids, a.completion_ids, a.logprobs) == (
        b.prompt_ids,
        b.completion_ids,
        b.logprobs,
    )
    assert text == plain.choices[0].message.content
    assert finish == plain.choices[0].finish_reason
    assert usage.completion_tokens == plain.usage.completion_tokens


async def test_n_choices_are_recorded_separately(tiny_gateway):
    r = await client(tiny_gateway).chat.completions.create(
        model="m", messages=HI, max_tokens=6, n=3, seed=3
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    calls = tiny_gateway.recorder.calls("r1")
    assert [c.choice_index for c in calls] == [0, 1, 2]
    assert len({c.request_id for c in calls}) == 1


async def test_rollout_calls_over_http(tiny_gateway):
    await client(tiny_gateway, "rx").chat.completions.create(model="m", messages=HI, max_tokens=3)
    base = f"http://127.0.0.1:{tiny_gateway.port}"
    async with httpx.AsyncClient() as http:
        body = (await http.get(f"{base}/rollouts/rx")).json()
        assert (
            body["calls"][0]["completion_ids"]
            == tiny_gateway.recorder.calls("rx")[0].completion_ids
        )
        models = (await http.get(f"{base}/v1/models")).json()
        assert models["data"][0]["id"] == "tiny"
        assert (await http.delete(f"{base}/rollouts/rx")).status_code == 200
        assert (await http.get(f"{base}/rollouts/rx")).json()["calls"] == []


def _body(**overrides):
    body = {"model": "tiny", "messages": HI, "max_tokens": 2}
    body.update(overrides)
    return json.dumps(body)


BAD_INPUTS = [
    (
        "malformed JSON",
        "/v1/chat/completions",
        '{"model": "tiny", "messages": [',
        400,
        "not valid JSON",
    ),
    ("not an object", "/v1/chat/completions", "[1, 2]", 400, "JSON object"),
    (
        "missing messages",
        "/v1/chat/completions",
        json.dumps({"model": "tiny"}),
        400,
        "messages: required field is missing",
    ),
    ("empty messages", "/v1/chat/completions", _body(messages=[]), 400, "messages"),
    ("unknown model", "/v1/chat/completions", _body(model="gpt-9"), 404, "'gpt-9' does not exist"),
    (
        "unknown field",
        "/v1/chat/completions",
        _body(temprature=0.5),
        400,
        "temprature: unknown field",
    ),
    ("wrong type", "/v1/chat/completions", _body(temperature="hot"), 400, "temperature"),
    ("temperature out of range", "/v1/chat/completions", _body(temperature=5), 400, "temperature"),
    ("n out of range", "/v1/chat/completions", _body(n=0), 400, "n:"),
    ("bad top_k", "/v1/chat/completions", _body(top_k=0), 400, "top_k"),
    ("max_tokens zero", "/v1/chat/completions", _body(max_tokens=0), 400, "max_tokens"),
    ("penalty", "/v1/chat/completions", _body(presence_penalty=1.0), 400, "penalties"),
    (
        "logit_bias",
        "/v1/chat/completions",
        _body(logit_bias={"42": -100}),
        400,
        "logit_bias is not supported: it changes the sampling distribution the trainer must "
        "reproduce; leave it out",
    ),
    (
        "bad role",
        "/v1/chat/completions",
        _body(messages=[{"role": "robot", "content": "x"}]),
        400,
        "messages[0].role",
    ),
    (
        "image part",
        "/v1/chat/completions",
        _body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        "text-only",
    ),
    (
        "too long",
        "/v1/chat/completions",
        _body(messages=[{"role": "user", "content": "hi " * 600}]),
        400,
        "context window",
    ),
    (
        "bad tool",
        "/v1/chat/completions",
        _body(tools=[{"type": "function", "function": {}}]),
        400,
        "tools[0]",
    ),
    (
        # a tool result that kept half an emoji (JSON escapes it as \ud83d): not Unicode text
        "lone surrogate",
        "/v1/chat/completions",
        _body(messages=[*HI, {"role": "user", "content": [{"type": "text", "text": "a\ud83d"}]}]),
        400,
        "messages[1].content[0].text holds half a UTF-16 surrogate pair (\\ud83d)",
    ),
    ("bad rollout id", "/rollouts/bad%20id/v1/chat/completions", _body(), 400, "rollout id"),
    (
        "top_logprobs without logprobs",
        "/v1/chat/completions",
        _body(top_logprobs=2),
        400,
        "top_logprobs needs logprobs: true",
    ),
]


@pytest.mark.parametrize(
    ("name", "path", "body", "status", "fragment"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
async def test_bad_input_gets_openai_style_4xx(tiny_gateway, name, path, body, status, fragment):
    url = f"http://127.0.0.1:{tiny_gateway.port}{path}"
    async with httpx.AsyncClient() as http:
        response = await http.post(url, content=body, headers={"content-type": "application/json"})
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert fragment in error["message"]
        assert error["type"]
        # the server keeps serving
        ok = await http.post(
            f"http://127.0.0.1:{tiny_gateway.port}/v1/chat/completions", content=_body()
        )
        assert ok.status_code == 200


async def test_what_vllm_refuses_is_counted_and_logged_once(tiny_gateway, caplog):
    """vLLM answers 400 to top_logprobs without logprobs, and to a max_tokens past the context
    window. The first is a 400 on /v1 too, but served on a training call (without log-probs);
    the second is cut to the room left on every route (a long judge transcript must not fail).
    Both are counted and logged once."""
    caplog.set_level("INFO", logger="agentscope_rft.gateway.app")
    base = f"http://127.0.0.1:{tiny_gateway.port}"
    url = f"{base}/rollouts/lenient/v1/chat/completions"
    async with httpx.AsyncClient(timeout=120) as http:
        for _ in range(2):
            r = await http.post(url, content=_body(top_logprobs=2))
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["logprobs"] is None  # not asked for
        for route in (url, f"{base}/v1/chat/completions"):
            long = _body(max_completion_tokens=600, temperature=1.0, ignore_eos=True)
            r = await http.post(route, content=long)
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] == 512
            assert r.json()["choices"][0]["finish_reason"] == "length"
        # Within the window: not counted.
        r = await http.post(f"{base}/v1/chat/completions", content=_body(max_tokens=400))
        assert r.status_code == 200, r.text
        counters = (await http.get(f"{base}/metrics?format=json")).json()
        text = (await http.get(f"{base}/metrics")).text
    assert counters["top_logprobs_without_logprobs"] == 2
    assert counters["max_tokens_capped"] == 2
    assert "agentscope_rft_gateway_top_logprobs_without_logprobs_total 2" in text
    logged = [r.getMessage() for r in caplog.records if "logged once" in r.getMessage()]
    assert len(logged) == 2
    assert "top_logprobs without logprobs: true" in logged[0]
    assert "it samples at most" in logged[1]


async def test_null_parameters_mean_their_defaults(tiny_gateway):
    """OpenAI takes null for any optional parameter (clients send it for one left unset)."""
    nulls = {
        "n": None, "stream": None, "logprobs": None, "presence_penalty": None,
        "frequency_penalty": None, "logit_bias": None, "seed": None, "stop": None,
        "temperature": None, "top_logprobs": None, "tools": None, "response_format": None,
    }  # fmt: skip
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(
            f"http://127.0.0.1:{tiny_gateway.port}/v1/chat/completions", content=_body(**nulls)
        )
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["logprobs"] is None


async def _engine_idle(gateway, seconds: float = 60.0) -> None:
    for _ in range(int(seconds * 10)):
        if gateway.engine.metrics()["running"] == 0 and not gateway.state.exchanges:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the engine still generates for a client that left")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_disconnects_frees_its_engine_slot(tiny_gateway, stream):
    """A client that gives up (its timeout, a killed app) stops the generation, as in vLLM: the
    slot is not held until max_tokens for a reply nobody reads (an OpenAI client retrying after
    its timeout would otherwise pile up generations)."""
    base = f"http://127.0.0.1:{tiny_gateway.port}"
    body = {"model": "m", "messages": HI, "max_tokens": 470, "ignore_eos": True, "stream": stream}
    decoded = tiny_gateway.engine.metrics()["decode_tokens"]
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, read=0.3)) as http:
        if stream:
            async with http.stream("POST", f"{base}/rollouts/gone/v1/chat/completions", json=body):
                pass  # read nothing, hang up
        else:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(f"{base}/rollouts/gone/v1/chat/completions", json=body)
    await _engine_idle(tiny_gateway)
    assert tiny_gateway.engine.metrics()["decode_tokens"] - decoded < 470  # stopped early
    assert tiny_gateway.recorder.calls("gone") == []  # the client never got it
    assert tiny_gateway.state.counters["requests_failed"] == 1
    async with httpx.AsyncClient(timeout=60) as http:  # and the gateway serves on
        assert (await http.post(f"{base}/v1/chat/completions", content=_body())).status_code == 200


TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


async def test_a_valid_tool_choice_is_served(tiny_gateway):
    url = f"http://127.0.0.1:{tiny_gateway.port}/v1/chat/completions"
    named = {"type": "function", "function": {"name": "calc"}}
    async with httpx.AsyncClient(timeout=60) as http:
        for choice in ("none", "auto", "required", named):
            response = await http.post(url, content=_body(tool_choice=choice, tools=TOOLS))
            assert response.status_code == 200, response.text
        assert (await http.post(url, content=_body(tool_choice="none"))).status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_body(tools=[{"type": "function"}]), "tools"),
        (_body(tools=[{"type": "function", "function": {"name": ""}}]), "tools"),
        (_body(stop=["a"] * 9), "stop"),
        (_body(stop=["a", ""]), "stop"),
        (_body(messages=[{"role": "robot", "content": "x"}]), "messages"),
        (_body(tool_choice="sometimes", tools=TOOLS), "tool_choice"),
        (_body(tool_choice={"foo": 1}, tools=TOOLS), "tool_choice"),
        (_body(tool_choice={"type": "function", "function": {"name": "nope"}}, tools=TOOLS),
         "tool_choice"),
        (_body(tool_choice="required"), "tool_choice"),
    ],
)  # fmt: skip
async def test_the_error_names_the_field_at_fault(tiny_gateway, body, param):
    url = f"http://127.0.0.1:{tiny_gateway.port}/v1/chat/completions"
    async with httpx.AsyncClient() as http:
        response = await http.post(url, content=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_any_int64_seed_is_served_reproducibly_and_larger_ones_are_400(tiny_gateway):
    url = f"http://127.0.0.1:{tiny_gateway.port}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=60) as http:
        for seed in (2**62, -(2**63)):  # seed * 1_000_003 overflowed int64 in the engine
            body = _body(seed=seed, temperature=1.0, max_tokens=6, n=2)
            first, second = [(await http.post(url, content=body)).json() for _ in range(2)]
            assert first["choices"] == second["choices"]
        response = await http.post(url, content=_body(seed=2**64))
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "seed"


async def test_streaming_request_errors_are_4xx_not_broken_streams(tiny_gateway):
    with pytest.raises(openai.BadRequestError, match="context window"):
        await client(tiny_gateway).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x " * 900}], stream=True
        )


async def test_api_key_is_enforced(tiny_model_path):
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu")
    await engine.start()
    async with Gateway(engine, api_key="sekret") as gateway:
        with pytest.raises(openai.AuthenticationError):
            await client(gateway, api_key="wrong").chat.completions.create(
                model="m", messages=HI, max_tokens=2
            )
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{gateway.port}/rollouts/r1")
            assert response.status_code == 401
        r = await client(gateway, api_key="sekret").chat.completions.create(
            model="m", messages=HI, max_tokens=2
        )
        assert r.choices[0].message.role == "assistant"
    await engine.close()


async def test_concurrent_rollouts_are_attributed_correctly(tiny_gateway):
    async def one(i):
        return await client(tiny_gateway, f"roll-{i}").chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"number {i}"}], max_tokens=5, seed=i
        )

    results = await asyncio.gather(*[one(i) for i in range(12)])
    for i, r in enumerate(results):
        [call] = tiny_gateway.recorder.calls(f"roll-{i}")
        assert call.messages[0]["content"] == f"number {i}"
        assert r.usage.completion_tokens == len(call.completion_ids)


async def test_metrics_in_prometheus_text_and_json(tiny_gateway):
    from prometheus_client.parser import text_string_to_metric_families

    await client(tiny_gateway, "m1").chat.completions.create(
        model="x", messages=HI, max_tokens=4, seed=0
    )
    async with httpx.AsyncClient(base_url=tiny_gateway.base_url.removesuffix("/v1")) as http:
        text = await http.get("/metrics")
        as_json = await http.get("/metrics", params={"format": "json"})
        bad = await http.get("/metrics", params={"format": "xml"})
    assert text.status_code == 200
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.text)
        for s in family.samples
    }
    [call] = tiny_gateway.recorder.calls("m1")
    assert samples[("agentscope_rft_gateway_requests_total", (("outcome", "ok"),))] == 1
    assert samples[("agentscope_rft_gateway_completion_tokens_total", ())] == len(
        call.completion_ids
    )
    assert samples[("agentscope_rft_gateway_request_seconds_count", ())] == 1
    assert samples[("agentscope_rft_recorder_rollouts", ())] == 1
    numbers = as_json.json()
    assert numbers["requests_ok"] == 1 and numbers["recorded_calls"] == 1
    assert numbers["recorder_bytes"] == samples[("agentscope_rft_recorder_bytes", ())] > 0
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "format"
