"""Bounded episodes on real AgentScope agents: deadlines hold, no call outlives its episode."""

import asyncio
import contextlib
import time

import httpx
import pytest
from agentscope.agent import Agent, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel

import agentscope_rft
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.types import RolloutStatus


def own_model(*, stream: bool, endless: bool = False) -> OpenAIChatModel:
    """An app's own model, as a user writes it (pointing elsewhere; redirected in episodes)."""
    return OpenAIChatModel(
        credential=OpenAICredential(api_key="sk-unused", base_url="http://127.0.0.1:9/v1"),
        model="gpt-4o-mini",
        stream=stream,
        # `endless`: no end-of-sequence and a huge limit, so the call would run to the context end
        parameters=OpenAIChatModel.Parameters(max_tokens=1_000_000 if endless else None),
        extra_body={"ignore_eos": True} if endless else None,
    )


def agent(name: str, model: OpenAIChatModel) -> Agent:
    return Agent(
        name=name,
        system_prompt=f"You are the {name}.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )


async def stubborn_app(task, _model):
    """Swallows everything, cancellation included, and keeps calling the model."""
    planner = agent("planner", own_model(stream=True, endless=True))
    solver = agent("solver", own_model(stream=False))
    with contextlib.suppress(BaseException):
        await planner.reply(UserMsg(name="user", content=task["q"]))
    for _ in range(3):
        with contextlib.suppress(BaseException):
            await solver.reply(UserMsg(name="user", content="solve it"))
    return 1.0


@pytest.fixture
async def long_gateway(tiny_model_path):
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu", served_model_name="t")
    await engine.start()
    gateway = Gateway(engine)
    await gateway.start()
    yield gateway
    await gateway.stop()
    await engine.close()


async def engine_idle(engine: EmbeddedEngine, within: float = 1.0) -> bool:
    deadline = time.perf_counter() + within
    while time.perf_counter() < deadline:
        if engine.batcher.num_running == 0:
            before = engine.batcher.stats["decode_tokens"]
            await asyncio.sleep(0.2)
            if engine.batcher.stats["decode_tokens"] == before:
                return True
        await asyncio.sleep(0.02)
    return False


async def test_deadline_holds_for_an_app_that_swallows_cancellation(long_gateway):
    timeout = 3.0
    explorer = Explorer(
        agentscope_rft.workflow(stubborn_app),
        long_gateway,
        EpisodeSettings(episode_timeout=timeout, max_retries=0),
    )
    started = time.perf_counter()
    rollout = await explorer.run_episode(load_tasks([{"id": "t", "q": "plan"}])[0], "stub")
    elapsed = time.perf_counter() - started
    engine = long_gateway.engine
    assert await engine_idle(engine, within=0.5), "the aborted call kept generating"
    await explorer.close()

    assert rollout.status is RolloutStatus.TIMEOUT, rollout.error
    assert "episode_timeout=3.0" in (rollout.error or "")
    assert elapsed < timeout + 2.5, elapsed
    # The planner's call was running at the deadline and was aborted, not recorded.
    assert rollout.late_calls == 1 and rollout.aborted_calls == 1
    # The solver never got a call through: every try was refused with 410.
    assert all(call.agent_name != "solver" for call in rollout.calls)
    counters = long_gateway.state.counters
    assert counters["requests_refused_closed"] >= 1
    assert counters["requests_aborted"] == 1
    assert long_gateway.recorder.in_flight("stub") == 0


BACKGROUND: list[asyncio.Task] = []


async def background_caller(task, model):
    """Returns while a call it started in the background still runs, and another later."""
    endless = own_model(stream=True, endless=True)

    async def chat() -> None:
        await agent("helper", endless).reply(UserMsg(name="user", content="go on"))

    background = asyncio.create_task(chat())
    BACKGROUND.append(background)
    await asyncio.sleep(0.5)  # the call is generating now
    return 0.5


async def test_calls_left_in_flight_are_aborted_and_counted(long_gateway):
    explorer = Explorer(
        agentscope_rft.workflow(background_caller),
        long_gateway,
        EpisodeSettings(episode_timeout=30, max_retries=0, late_call_grace=0.5),
    )
    [task] = load_tasks([{"id": "b"}])
    result = await explorer.explore([task], group_size=1, batch_id="bg")
    assert await engine_idle(long_gateway.engine, within=0.5)
    [rollout] = result.rollouts
    assert rollout.ok and rollout.reward == 0.5
    assert (rollout.late_calls, rollout.aborted_calls) == (1, 1)
    assert result.metrics()["episode/late_calls"] == 1.0
    assert result.metrics()["episode/aborted_calls"] == 1.0
    # The background task saw its call fail; a new call under the ended rollout is refused.
    await asyncio.wait(BACKGROUND, timeout=5)
    assert all(t.done() for t in BACKGROUND)
    assert "is closed (finished)" in str(BACKGROUND[0].exception())
    async with httpx.AsyncClient() as client:
        refused = await client.post(
            long_gateway.rollout_base_url("bg.0") + "/chat/completions",
            json={"model": "t", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert refused.status_code == 410
    assert refused.json()["error"]["code"] == "rollout_closed"
    assert refused.headers["x-should-retry"] == "false"
    await explorer.close()


async def test_close_over_http_aborts_a_remote_episode(long_gateway):
    """A runner in another process ends its rollout by URL (what `close_rollout` does)."""
    base = long_gateway.rollout_base_url("remote")
    body = {
        "model": "t",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100_000,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        call = asyncio.create_task(client.post(base + "/chat/completions", json=body))
        while long_gateway.recorder.in_flight("remote") == 0:
            await asyncio.sleep(0.02)
        root = base.removesuffix("/v1")
        closed = await client.post(root + "/close", json={"reason": "timeout", "grace": 0.2})
        assert closed.json() == {"rollout_id": "remote", "late_calls": 1, "aborted_calls": 1}
        response = await call
        assert response.status_code == 410 and "closed (timeout)" in response.text
        bad = await client.post(root + "/close", json={"grace": "soon"})
        assert bad.status_code == 400 and "grace" in bad.text
    assert await engine_idle(long_gateway.engine, within=0.5)


async def test_calls_are_capped_even_when_the_app_sets_no_limit(tiny_model_path):
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu", max_model_len=512)
    await engine.start()
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        Gateway(engine, max_tokens_limit=12) as gateway,
        httpx.AsyncClient(timeout=60) as client,
    ):
        url = gateway.rollout_base_url("cap") + "/chat/completions"
        capped = await client.post(url, json={**body, "ignore_eos": True})
        asked_less = await client.post(url, json={**body, "ignore_eos": True, "max_tokens": 5})
    await engine.close()
    assert capped.json()["usage"]["completion_tokens"] == 12
    assert capped.json()["choices"][0]["finish_reason"] == "length"
    assert asked_less.json()["usage"]["completion_tokens"] == 5


async def planner_solver_app(task, _model):
    """The shape users report: a streaming planner and a non-streaming solver, each with its own
    model and no `max_tokens`."""
    planner = agent("planner", own_model(stream=True))
    solver = agent("solver", own_model(stream=False))
    plan = await planner.reply(UserMsg(name="user", content=task["q"]))
    answer = await solver.reply(UserMsg(name="planner", content=plan.get_text_content() or "-"))
    return float(bool(answer.get_text_content()))


async def test_check_workflow_twenty_times_ends_cleanly(tiny_model_path, monkeypatch):
    stops: list[float] = []
    original_stop = Gateway.stop

    async def timed_stop(self, *args, **kwargs):
        seconds = await original_stop(self, *args, **kwargs)
        stops.append(seconds)
        return seconds

    monkeypatch.setattr(Gateway, "stop", timed_stop)
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu", max_model_len=128)
    await engine.start()
    try:
        for i in range(20):
            report = await agentscope_rft.check_workflow(
                planner_solver_app, {"id": f"c{i}", "q": "2+2?"}, engine=engine, show=False
            )
            assert report.rollout.ok, report.rollout.error
            assert [c.agent_name for c in report.rollout.calls] == ["planner", "solver"]
            # no max_tokens from the app: the default cap (a quarter of 128) bounds every call
            assert all(len(c.completion_ids) <= 32 for c in report.rollout.calls)
    finally:
        await engine.close()
    assert len(stops) == 20
    assert max(stops) < 2.0, stops


async def test_stop_with_calls_in_flight_is_bounded_and_does_not_raise(tiny_model_path):
    """The crash users saw: a call still streaming when the gateway stops."""
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu")
    await engine.start()
    gateway = Gateway(engine)
    await gateway.start()
    body = {
        "model": "x",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100_000,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(timeout=60) as client:

        async def streamed() -> str:
            url = gateway.rollout_base_url("s") + "/chat/completions"
            async with client.stream("POST", url, json={**body, "stream": True}) as response:
                return "".join([chunk async for chunk in response.aiter_text()])

        calls = [
            asyncio.create_task(streamed()),
            asyncio.create_task(
                client.post(
                    gateway.base_url + "/chat/completions",
                    json={**body, "model": engine.model_name},  # unattributed: the served name
                )
            ),
        ]
        while len(gateway.state.exchanges) < 2:
            assert not any(c.done() for c in calls), [c.result() for c in calls if c.done()]
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # both are generating
        seconds = await gateway.stop()
        assert seconds < 2.0
        stream_text, plain = await asyncio.gather(*calls, return_exceptions=True)
    assert await engine_idle(engine, within=0.5)
    await engine.close()
    assert "shutting down" in str(stream_text)  # the stream ends with an error event
    assert isinstance(plain, httpx.Response) and plain.status_code == 503
    assert await gateway.stop() == 0.0  # stopping twice is harmless


async def test_an_app_that_exits_or_cancels_itself_fails_only_its_episode():
    """`sys.exit()` in an app or a `CancelledError` it raises itself fails that episode with a
    message saying so; its neighbours are recorded (before: sys.exit stopped the run, and the
    CancelledError cancelled the whole batch, which `explore` reported as 0 rollouts)."""
    import sys

    from agentscope_rft.testing import ScriptedEngine

    async def run(task, model):
        await agent("solver", model).reply(UserMsg(name="user", content="hi"))
        if task["id"] == "exits":
            sys.exit("gave up")
        if task["id"] == "cancels":
            raise asyncio.CancelledError
        return 1.0

    async with Gateway(ScriptedEngine(lambda m, t: "done")) as gateway:
        settings = EpisodeSettings(episode_timeout=30, max_retries=1)
        explorer = Explorer(agentscope_rft.workflow(run), gateway, settings)
        tasks = load_tasks([{"id": "exits"}, {"id": "ok"}, {"id": "cancels"}])
        rollouts = await asyncio.gather(*(explorer.run_episode(t) for t in tasks))
        await explorer.close()
    by_task = {r.task_id: r for r in rollouts}
    assert by_task["ok"].status is RolloutStatus.OK and by_task["ok"].reward == 1.0
    assert by_task["exits"].status is RolloutStatus.FAILED
    assert "called sys.exit('gave up')" in (by_task["exits"].error or "")
    assert by_task["cancels"].status is RolloutStatus.FAILED
    assert "raised asyncio.CancelledError though nothing cancelled it" in (
        by_task["cancels"].error or ""
    )
    assert by_task["cancels"].attempts == 2  # a failure like any other: retried
