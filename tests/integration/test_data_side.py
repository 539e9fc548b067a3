"""The data side in real runs on a tiny model: the policy as group judge through the run's own
gateway (its calls never recorded for training), curriculum statistics exported and resumed
exactly, operators and replay counted in the step metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentscope_rft.config import load_config
from agentscope_rft.data.judges import GroupJudge, JudgeClient
from agentscope_rft.data.operators import Episode, Group, Pipeline
from agentscope_rft.runtime.local import train
from agentscope_rft.types import Sample

# The shared engines' gateways serve on the session's event loop (tests/integration/conftest.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")

APP = "tests/integration/toy_app.py:run"


async def test_policy_as_group_judge_is_served_not_recorded(tiny_gateway) -> None:
    gateway = tiny_gateway
    sample = Sample([1, 2], [0, 1], [0.0, -0.1], 0.5, "r0", "t", group_id="g", sample_id="s")
    group = Group("g", {"question": "2+2?"}, (Episode("r0", (sample,), "4", 0.5),))

    def judge(structured: bool) -> GroupJudge:
        client = JudgeClient(
            gateway.base_url, model="tiny", api_key=gateway.api_key, timeout=60, max_tokens=24,
            max_retries=1, structured_output=structured,
        )  # fmt: skip
        return GroupJudge(client)

    # Free text: a tiny random model writes no JSON; both tries are answered, neither parses;
    # the group keeps its reward and nothing raised.
    free = judge(structured=False)
    kept, metrics = await Pipeline([free])([group])
    assert metrics["data/group_judge/calls"] == 2.0
    assert metrics["data/group_judge/failures"] == 1.0
    assert kept[0].episodes[0].reward == 0.5
    assert free.last_error is not None and "no JSON object" in free.last_error  # answered
    # Structured output (the default): the same model's answer is the asked JSON at once.
    constrained = judge(structured=True)
    kept, metrics = await Pipeline([constrained])([group])
    assert metrics["data/group_judge/calls"] == 1.0
    assert metrics["data/group_judge/failures"] == 0.0
    assert 0.0 <= kept[0].episodes[0].reward <= 1.0
    assert gateway.recorder.rollout_ids == []  # the judge's calls are nobody's rollout
    await free.close()
    await constrained.close()


@pytest.fixture(scope="module")
def mixed_tasks(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "tasks.jsonl"
    rows = [{"id": f"t{i}", "prompt": f"Say something {i}"} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def data_config(model: str, tasks: Path, run_dir: Path, *extra: str):
    return load_config(
        None,
        [
            f"model.name_or_path={model}",
            f"workflow={APP}",
            f"tasks.train={tasks}",
            "explorer.group_size=4",
            "explorer.tasks_per_step=2",
            "explorer.sampling.max_tokens=8",
            "engine.dtype=float32",
            "trainer.dtype=float32",
            "trainer.lr=1e-2",
            "trainer.old_logprobs=recompute",
            f"run.dir={run_dir}",
            "run.name=data",
            "monitor.tensorboard=false",
            "monitor.plot_every=0",
            "data.selector.type=curriculum",
            "data.operators=[{type: dedup, threshold: 0.95}, "
            "{type: group_judge, endpoint: {max_tokens: 16, max_retries: 0, timeout: 60}}]",
            "buffer.type=sql",
            "buffer.replay={ratio: 0.5, max_staleness: 1}",
            *extra,
        ],
    )


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == "train"]


def explored_tasks(run_dir: Path) -> list[str]:
    lines = (run_dir / "rollouts.jsonl").read_text().splitlines()
    return [json.loads(line)["task_id"] for line in lines]


async def test_curriculum_judge_and_replay_in_a_run_resume_exactly(
    tiny_model_path, mixed_tasks, tmp_path
) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    extra = ("run.steps=4", "run.checkpoint_every=2")
    await train(data_config(tiny_model_path, mixed_tasks, straight, *extra), straight)

    rows = metric_rows(straight)
    assert len(rows) == 4
    # every step: the judge was asked once per group; its failures are counted, not raised
    assert all(r["data/group_judge/calls"] == 2.0 for r in rows)
    assert all(r["data/group_judge/failures"] == r["data/group_judge/failed_groups"] for r in rows)
    assert all("data/dedup/episodes_dropped" in r for r in rows)
    # replay: one group of the step before (ratio 0.5 of 2) from step 1 on, when one qualifies
    assert sum(r.get("replay/samples", 0.0) for r in rows[1:]) > 0
    assert "replay/samples" not in rows[0]
    # the judge's calls are not episodes: 4 steps x 2 tasks x 4 episodes
    assert len(explored_tasks(straight)) == 32
    stats = json.loads((straight / "task_stats.json").read_text())
    assert stats["step"] == 3
    assert sum(t["episodes"] for t in stats["tasks"]) == 32
    state = json.loads((straight / "state.json").read_text())
    assert state["sampler"]["selector"] == "curriculum"

    # Interrupt a second run right after its step-2 checkpoint, then resume it.
    job = asyncio.create_task(
        train(data_config(tiny_model_path, mixed_tasks, resumed, *extra), resumed)
    )
    state_file = resumed / "state.json"
    while not (state_file.is_file() and json.loads(state_file.read_text())["step"] == 2):
        assert not job.done(), job.exception()
        await asyncio.sleep(0.05)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    await train(load_config(resumed / "config.yaml"), resumed, resume=True)

    # the same tasks chosen after the resume as without it, and the same statistics at the end
    assert explored_tasks(resumed)[-16:] == explored_tasks(straight)[-16:]
    assert json.loads((resumed / "task_stats.json").read_text()) == stats


async def test_operators_that_drop_every_episode_stop_the_run_naming_them(
    tiny_model_path, mixed_tasks, tmp_path
):
    from agentscope_rft.runtime.training import NoSamplesError

    run_dir = tmp_path / "run"
    config = data_config(
        tiny_model_path,
        mixed_tasks,
        run_dir,
        "data.operators=[{type: length, min_tokens: 1000}]",  # replies have at most 8 tokens
        "buffer.replay=null",
        "run.steps=5",
    )
    with pytest.raises(NoSamplesError) as error:
        await train(config, run_dir)
    message = str(error.value)
    assert "3 steps in a row produced no training samples" in message
    assert "data.operators dropped every episode (length: 8 dropped)" in message
    assert "failed" not in message  # the episodes did not fail
    rows = metric_rows(run_dir)
    assert [r["train/skipped"] for r in rows] == [1.0] * 3
    assert [r["data/length/episodes_dropped"] for r in rows] == [8.0] * 3
