"""The event-loop monitor on real episodes: an app that blocks the loop is named, one that awaits
is not. The blocks (2 s) are four times the threshold (0.5 s), so no timing decides a verdict."""

import asyncio
import logging
import time

import pytest
from agentscope.agent import Agent, InjectionConfig
from agentscope.message import UserMsg

import agentscope_rft
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer, ExploreResult
from agentscope_rft.explorer.loop_monitor import BLOCK_THRESHOLD, LoopMonitor
from agentscope_rft.explorer.tasks import load_tasks

# The shared engines' gateways serve on the session's event loop (tests/integration/conftest.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")

BLOCK = 2.0


async def _ask(model) -> None:
    agent = Agent(
        name="assistant",
        system_prompt="Reply.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    await agent.reply(UserMsg(name="user", content="hello"))


async def sleeping_app(task, model):
    await _ask(model)
    time.sleep(BLOCK)  # the bug: blocks the event loop every episode shares
    return 1.0


async def computing_app(task, model):
    await _ask(model)
    end = time.monotonic() + BLOCK
    steps = 0
    while time.monotonic() < end:  # CPU-bound work on the loop
        steps += 1
    return 1.0


async def awaiting_app(task, model):
    await _ask(model)
    await asyncio.sleep(BLOCK)  # the same pause, awaited
    await asyncio.to_thread(time.sleep, BLOCK)  # blocking work in a thread, as advised
    return 1.0


async def explore(app, gateway) -> ExploreResult:
    explorer = Explorer(
        agentscope_rft.workflow(app), gateway, EpisodeSettings(max_tokens=4, max_concurrency=2)
    )
    try:
        return await explorer.explore(load_tasks([{"id": "t0"}]), group_size=2, batch_id="b")
    finally:
        await explorer.close()


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "agentscope_rft.explorer.loop_monitor" and r.levelno == logging.WARNING
    ]


async def test_an_app_that_sleeps_on_the_loop_is_named_with_the_fix(tiny_gateway, caplog):
    caplog.set_level(logging.WARNING)
    result = await explore(sleeping_app, tiny_gateway)
    assert all(r.ok for r in result.rollouts)
    metrics = result.metrics()
    # One block per episode, also when they blocked back to back (one stall of 4 s).
    assert metrics["explore/loop_blocks"] == 2
    assert metrics["explore/loop_lag_max"] >= BLOCK - 0.2
    (warning,) = _warnings(caplog)  # once per place
    assert "test_loop_monitor.py" in warning and "in sleeping_app: time.sleep(BLOCK)" in warning
    assert "await asyncio.to_thread(" in warning


async def test_cpu_work_on_the_loop_is_named(tiny_gateway, caplog):
    caplog.set_level(logging.WARNING)
    result = await explore(computing_app, tiny_gateway)
    assert result.metrics()["explore/loop_blocks"] == 2
    (warning,) = _warnings(caplog)
    assert "in computing_app:" in warning


async def test_an_app_that_awaits_is_not_blamed(tiny_gateway, caplog):
    caplog.set_level(logging.WARNING)
    result = await explore(awaiting_app, tiny_gateway)
    assert all(r.ok for r in result.rollouts)
    metrics = result.metrics()
    assert metrics["explore/loop_blocks"] == 0
    assert metrics["explore/loop_lag_max"] < BLOCK  # the loop kept turning
    assert _warnings(caplog) == []


async def test_a_paused_monitor_does_not_count_what_blocks_meanwhile(caplog):
    caplog.set_level(logging.WARNING)
    monitor = LoopMonitor()
    async with monitor.watching() as window:
        await asyncio.sleep(0.3)
        with monitor.paused():  # e.g. a trainer step in this process
            time.sleep(BLOCK_THRESHOLD * 3)
        await asyncio.sleep(0.3)
    assert window.blocks == 0 and window.lag_max < BLOCK_THRESHOLD
    assert _warnings(caplog) == []
    async with monitor.watching() as window:  # and watches again after
        await asyncio.sleep(0.3)
        time.sleep(BLOCK_THRESHOLD * 3)
        await asyncio.sleep(0.3)
    assert window.blocks == 1 and window.lag_max >= BLOCK_THRESHOLD * 2


async def _short_bursts(stop: asyncio.Event) -> None:
    """CPU work in slices of 20 ms, each well under asyncio's own 0.1 s, between awaits."""
    while not stop.is_set():
        end = time.monotonic() + 0.02
        while time.monotonic() < end:
            pass
        await asyncio.sleep(0)


async def test_a_loop_busy_with_many_episodes_short_callbacks_is_not_a_block(caplog):
    """60 tasks of 20 ms slices make every loop iteration take 1.2 s: the loop is slow (its lag
    says so), but no one call held it, so nothing is blamed."""
    caplog.set_level(logging.WARNING)
    monitor = LoopMonitor()
    stop = asyncio.Event()
    async with monitor.watching() as window:
        tasks = [asyncio.create_task(_short_bursts(stop)) for _ in range(60)]
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.gather(*tasks)
    assert window.lag_max >= BLOCK_THRESHOLD * 2
    assert window.blocks == 0
    assert _warnings(caplog) == []


async def test_check_workflow_warns_about_an_app_that_blocks(tiny_gateway, caplog):
    caplog.set_level(logging.WARNING)
    report = await agentscope_rft.check_workflow(
        sleeping_app, {"id": "t"}, engine=tiny_gateway.engine, show=False
    )
    assert report.rollout.ok
    (warning,) = _warnings(caplog)
    assert "in sleeping_app: time.sleep(BLOCK)" in warning


async def _block(seconds: float) -> None:
    time.sleep(seconds)


async def test_calls_that_block_back_to_back_count_once_each(caplog):
    """Two tasks ready together run in one loop iteration: one stall of 2 s, two blocks."""
    caplog.set_level(logging.WARNING)
    monitor = LoopMonitor()
    async with monitor.watching() as window:
        await asyncio.sleep(0.3)
        await asyncio.gather(asyncio.create_task(_block(1.0)), asyncio.create_task(_block(1.0)))
        await asyncio.sleep(0.3)
    assert window.blocks == 2 and window.lag_max >= 1.8
    (warning,) = _warnings(caplog)  # one place
    assert "in _block: time.sleep(seconds)" in warning and "(a stall of " in warning
