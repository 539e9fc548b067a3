"""Bad input: a property-based fuzz of the gateway (hypothesis), over 1,000 generated requests.

Wrong types, missing fields, absurd values, broken UTF-8 and JSON, huge and deeply nested bodies,
hostile rollout ids, streamed and not: no response is a 5xx, every 4xx carries an OpenAI-style
error body, and the server is healthy afterwards (it answers a normal request, nothing is left in
flight). The gateway runs on loopback in its own thread with the tiny real model (a short context
window keeps generation quick). A reliability figure of docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.gateway.server import Gateway

MIN_REQUESTS = 1000
VALID = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "n", "stop", "seed", "stream", "stream_options", "logprobs", "top_logprobs", "tools",
    "tool_choice", "return_token_ids", "ignore_eos", "presence_penalty", "logit_bias", "user",
    "response_format", "bogus_field",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
roles = st.sampled_from(["user", "system", "assistant", "tool", "developer", "function", "x"])
parts = st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "bogus"])},
                          optional={"text": json_values, "image_url": json_values}),
    max_size=3,
)  # fmt: skip
messages = st.lists(
    st.fixed_dictionaries(
        {"role": roles | st.text(max_size=5)},
        optional={
            "content": st.one_of(st.text(max_size=200), parts, json_values),
            "name": json_values,
            "tool_calls": json_values,
            "tool_call_id": json_values,
        },
    ),
    max_size=4,
)
field_values = {
    "messages": st.one_of(messages, json_values),
    "max_tokens": st.one_of(st.integers(-5, 10**12), json_values),
    "n": st.one_of(st.integers(-3, 100), json_values),
    "temperature": st.one_of(st.floats(-10, 10), json_values),
    "stream": st.booleans(),
}
mutations = st.lists(st.sampled_from(FIELDS), max_size=4, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({k: field_values.get(k, json_values) for k in keys})
)
removals = st.lists(st.sampled_from(["model", "messages"]), max_size=2, unique=True)
rollout_ids = st.one_of(
    st.from_regex(r"[A-Za-z0-9_.:\-]{1,40}", fullmatch=True),
    st.text(max_size=260),
    st.sampled_from(["..", "../../etc/passwd", "%00", "a" * 201, "ö", " ", "a/b", "?x=1", "#"]),
)


@st.composite
def requests(draw) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers) of one hostile request."""
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "raw", "json", "utf8"]))
    if draw(st.booleans()):
        path = "/v1/chat/completions"
    else:
        path = f"/rollouts/{quote(draw(rollout_ids), safe='')}/v1/chat/completions"
    headers = {"content-type": draw(st.sampled_from(["application/json", "text/plain", "x/y"]))}
    if kind == "raw":
        return path, draw(st.binary(max_size=300)), headers
    if kind == "json":
        return path, json.dumps(draw(json_values)).encode(), headers
    body = {**VALID, **draw(mutations)}
    for key in draw(removals):
        body.pop(key, None)
    data = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    if kind == "utf8":  # an invalid UTF-8 byte inside the JSON text
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + data[cut:]
    return path, data, headers


def huge_requests() -> Iterator[tuple[str, bytes]]:
    """Bodies no generator draws by chance: megabytes, deep nesting, many messages."""
    path = "/rollouts/huge/v1/chat/completions"
    yield (
        path,
        json.dumps({**VALID, "messages": [{"role": "user", "content": "x " * 2_000_000}]}).encode(),
    )
    yield (
        path,
        json.dumps({**VALID, "messages": [{"role": "user", "content": "hi"}] * 50_000}).encode(),
    )
    yield path, b"[" * 100_000 + b"]" * 100_000
    yield path, b'{"model": "tiny", "messages": ' + b"[" * 50_000
    yield path, json.dumps({**VALID, "stop": ["a"] * 10_000, "n": 10**9}).encode()
    yield (
        path,
        json.dumps(
            {**VALID, "tools": [{"type": "function", "function": {"name": "f" * 10**6}}]}
        ).encode(),
    )


class ServerThread:
    """The tiny engine and the gateway, served from their own event loop in a thread."""

    def __init__(self, model_path: str) -> None:
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.gateway: Gateway | None = None
        self.thread = threading.Thread(target=asyncio.run, args=(self._main(model_path),))

    async def _main(self, model_path: str) -> None:
        engine = EmbeddedEngine(
            model_path, dtype="float32", device="cpu", max_model_len=96, served_model_name="tiny"
        )
        await engine.start()
        self.gateway = Gateway(engine)
        await self.gateway.start()
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        self.ready.set()
        await self.stop.wait()
        await self.gateway.stop()
        await engine.close()

    def __enter__(self) -> ServerThread:
        self.thread.start()
        assert self.ready.wait(300), "the gateway did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.loop is not None and self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(60)


def check_response(response: httpx.Response, body: bytes, statuses: Counter[int]) -> None:
    statuses[response.status_code] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500], body[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert "param" in error and "code" in error


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fuzzed_requests_never_get_a_5xx_and_errors_are_openai_style(tiny_model_path):
    statuses: Counter[int] = Counter()
    with ServerThread(tiny_model_path) as server, httpx.Client(timeout=120) as http:
        assert server.gateway is not None
        base = server.gateway.base_url.removesuffix("/v1")

        def send(path: str, body: bytes, headers: dict[str, str] | None = None) -> None:
            with http.stream("POST", base + path, content=body, headers=headers) as response:
                response.read()
            check_response(response, body, statuses)

        @settings(
            max_examples=MIN_REQUESTS,
            deadline=None,
            database=None,
            derandomize=True,  # the same 1,000 requests on every run
            suppress_health_check=list(HealthCheck),
        )
        @given(requests())
        def fuzz(request: tuple[str, bytes, dict[str, str]]) -> None:
            send(*request)

        fuzz()
        for path, body in huge_requests():
            send(path, body)

        total = sum(statuses.values())
        assert total >= MIN_REQUESTS, statuses
        # Healthy afterwards: it answers, records, and has nothing left in flight.
        assert http.get(base + "/health").json()["status"] == "ok"
        ok = http.post(base + "/rollouts/after/v1/chat/completions", json=VALID)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"
        gateway = server.gateway
        assert len(gateway.recorder.calls("after")) == 1
        assert gateway.state.active == {}
        assert all(gateway.recorder.in_flight(r) == 0 for r in gateway.recorder.rollout_ids)
    print(f"fuzz: {total} requests, statuses {dict(sorted(statuses.items()))}")
