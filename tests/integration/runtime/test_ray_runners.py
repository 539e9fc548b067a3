"""Episodes in Ray runner processes: isolation from crashes, segfaults, blocking code and leaks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from agentscope_rft.api import load_workflow
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.runner import ModelSettings
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.runtime.config import RuntimeConfig
from agentscope_rft.runtime.ray.pool import RayRunnerPool
from agentscope_rft.runtime.ray.process import RunnerSpec
from agentscope_rft.types import RolloutStatus

# The shared engines' gateways serve on the session's event loop (tests/integration/conftest.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")

APP = str(Path(__file__).with_name("ray_apps.py")) + ":run"
WORKFLOW = load_workflow(APP)
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}}


async def start_pool(gateway, stuck_grace: float = 10.0, **runtime) -> RayRunnerPool:
    config = RuntimeConfig(type="ray", runner_cpus=0.25, **runtime)
    spec = RunnerSpec(workflow=APP, judge=None, model=ModelSettings("tiny", max_tokens=4))
    pool = RayRunnerPool(
        spec,
        config,
        f"http://127.0.0.1:{gateway.port}",
        runtime_env=RUNTIME_ENV,
        stuck_grace=stuck_grace,
    )
    await pool.start()
    return pool


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["sigkill", "segfault"])
async def test_a_runner_that_dies_costs_one_retried_attempt(
    crash, ray_driver, tiny_gateway, tmp_path
):
    pool = await start_pool(tiny_gateway, runners=2, episodes_per_runner=2)
    explorer = Explorer(WORKFLOW, tiny_gateway, EpisodeSettings(max_retries=1), runner=pool)
    marker = tmp_path / "crashed"
    tasks = load_tasks(
        [{"id": "crash", "crash": crash, "marker": str(marker)}]
        + [{"id": f"ok{i}"} for i in range(3)]
    )
    result = await explorer.explore(tasks, group_size=1, batch_id="s0")
    assert await pool.settle() == 2  # the dead runner was replaced
    await explorer.close()

    assert marker.exists()  # the first attempt really killed its process
    assert all(r.ok for r in result.rollouts), [r.error for r in result.rollouts]
    crashed = next(r for r in result.rollouts if r.task_id == "crash")
    assert crashed.attempts == 2 and crashed.rollout_id == "s0.0.retry1"
    assert crashed.runner is not None and crashed.runner.split("/")[1] != marker.read_text()
    # Only the successful attempt's calls became samples; the lost attempt's were dropped.
    trained = {s.rollout_id for s in result.samples}
    assert "s0.0" not in trained and "s0.0.retry1" in trained
    assert await tiny_gateway.recorder.take("s0.0", wait_timeout=0.1) == []
    assert [s.value for s in crashed.step_rewards] == [0.25]  # emitted in the runner process
    metrics = result.metrics()
    assert metrics["runtime/runner_deaths"] == 1
    assert metrics["runtime/runners_started"] >= 2


@pytest.mark.slow
async def test_a_blocking_episode_does_not_stall_the_other_runner(ray_driver, tiny_gateway):
    pool = await start_pool(tiny_gateway, runners=2, episodes_per_runner=1)
    explorer = Explorer(WORKFLOW, tiny_gateway, EpisodeSettings(), runner=pool)
    tasks = load_tasks([{"id": "block", "block": 6}] + [{"id": f"q{i}"} for i in range(4)])
    started = time.time()
    result = await explorer.explore(tasks, group_size=1, batch_id="b")
    await explorer.close()

    by_id = {r.task_id: r for r in result.rollouts}
    assert all(r.ok for r in result.rollouts)
    assert by_id["block"].finished_at - started >= 6
    quick = [by_id[f"q{i}"] for i in range(4)]
    # All four ran on the other runner, while the blocked one slept.
    assert len({r.runner for r in quick}) == 1 and quick[0].runner != by_id["block"].runner
    assert max(r.finished_at for r in quick) < by_id["block"].finished_at
    # The blocked runner's own loop monitor saw the stall and named it once (ray_apps.py's
    # time.sleep); the other runner's loop kept going.
    metrics = result.metrics()
    assert metrics["explore/loop_blocks"] == 1, {k: v for k, v in metrics.items() if "loop" in k}
    assert metrics["explore/loop_lag_max"] >= 5


@pytest.mark.slow
async def test_a_runner_stuck_past_the_timeout_is_replaced(ray_driver, tiny_gateway):
    pool = await start_pool(tiny_gateway, stuck_grace=1.0, runners=2, episodes_per_runner=1)
    settings = EpisodeSettings(episode_timeout=5.0, max_retries=0)
    explorer = Explorer(WORKFLOW, tiny_gateway, settings, runner=pool)
    tasks = load_tasks([{"id": "stuck", "block": 60}, {"id": "fine"}])
    started = time.perf_counter()
    result = await explorer.explore(tasks, group_size=1, batch_id="t")
    assert time.perf_counter() - started < 30  # not the 60 s the episode blocks for
    by_id = {r.task_id: r for r in result.rollouts}
    assert by_id["stuck"].status is RolloutStatus.TIMEOUT and by_id["fine"].ok
    metrics = result.metrics()
    assert metrics["runtime/runners_stuck"] == 1
    # The replacement takes episodes again.
    explorer = Explorer(WORKFLOW, tiny_gateway, EpisodeSettings(), runner=pool)
    assert await pool.settle() == 2
    again = await explorer.explore(load_tasks([{"id": "after"}]), group_size=2, batch_id="u")
    await explorer.close()
    assert all(r.ok for r in again.rollouts)
    assert by_id["stuck"].runner not in {r.runner for r in again.rollouts}
    assert by_id["stuck"].runner is not None
    stuck_pid = int(by_id["stuck"].runner.split("/")[1])
    assert not psutil.pid_exists(stuck_pid) or psutil.Process(stuck_pid).status() == "zombie"


@pytest.mark.slow
async def test_a_leaking_runner_is_recycled(ray_driver, tiny_gateway):
    pool = await start_pool(tiny_gateway, runners=1, episodes_per_runner=1, runner_memory_mb=64)
    explorer = Explorer(WORKFLOW, tiny_gateway, EpisodeSettings(), runner=pool)
    tasks = load_tasks([{"id": "leak", "leak_mb": 32}, {"id": "next"}])
    result = await explorer.explore(tasks, group_size=1, batch_id="l")
    await explorer.close()
    assert all(r.ok for r in result.rollouts)
    # Any runner is above 64 MB (Python + AgentScope): each is replaced after its episode.
    assert result.metrics()["runtime/runners_recycled"] == 2
    assert len({r.runner for r in result.rollouts}) == 2
    assert os.getpid() not in {int(r.runner.split("/")[1]) for r in result.rollouts if r.runner}


@pytest.mark.slow
async def test_a_workflow_that_does_not_import_in_the_runner_fails_the_start(ray_driver, tmp_path):
    from agentscope_rft.runtime.ray.pool import RunnerStartError

    spec = RunnerSpec(
        workflow=f"{tmp_path}/missing_app.py:run", judge=None, model=ModelSettings("tiny")
    )
    pool = RayRunnerPool(
        spec, RuntimeConfig(type="ray", runners=1, runner_cpus=0.25), "http://127.0.0.1:9"
    )
    with pytest.raises(RunnerStartError, match=r"missing_app\.py does not exist"):
        await pool.start()
