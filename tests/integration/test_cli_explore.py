"""`agentscope-rft explore` then `buffer export`, as a user runs them."""

import json
import subprocess
import sys

import pytest
import yaml


def test_explore_writes_results_and_exportable_samples(calc_model_path, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": "What is (2+3)*4?", "answer": "20"}) + "\n"
            for i in range(3)
        )
    )
    config = tmp_path / "calc.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": calc_model_path},
                "engine": {"dtype": "float32"},
                "workflow": "tests.integration.test_explorer:calc_workflow",
                "tasks": {"train": str(tasks)},
                "explorer": {"group_size": 2, "sampling": {"temperature": 0.0}},
                "run": {"dir": str(tmp_path / "run")},
            }
        )
    )
    out = tmp_path / "explore"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentscope_rft.cli",
            "explore",
            "--config",
            str(config),
            "--limit",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reward/mean" in done.stdout
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in results] == ["q0", "q1"]
    assert all(r["rewards"] == [1.0, 1.0] for r in results)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["explore/rollouts"] == 4 and summary["trajectory/merge_rate"] == 1.0
    # every group solved alike: the diagnosis says a step would learn nothing, once
    assert summary["diagnosis/equal_rewards"] == 1.0
    [record] = [json.loads(x) for x in (out / "diagnosis.jsonl").read_text().splitlines()]
    assert [f["code"] for f in record["findings"]] == ["equal_rewards"]
    printed = " ".join((done.stdout + done.stderr).split())  # the console wraps long lines
    assert printed.count("have equal rewards") == 1

    exported = tmp_path / "samples.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentscope_rft.cli",
            "buffer",
            "export",
            "--url",
            str(out / "buffer.db"),
            "--out",
            str(exported),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(x) for x in exported.read_text().splitlines()]
    assert len(rows) == 4
    for field in (
        "token_ids",
        "loss_mask",
        "logprobs",
        "reward",
        "rollout_id",
        "task_id",
        "policy_version",
        "agent_name",
        "stop_reason",
    ):
        assert field in rows[0]
    assert rows[0]["agent_name"] == "calc" and rows[0]["reward"] == 1.0
    assert len(rows[0]["token_ids"]) == len(rows[0]["loss_mask"]) == len(rows[0]["logprobs"])


def test_explore_with_a_broken_workflow_path_fails_clearly(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n')
    config = tmp_path / "bad.yaml"
    config.write_text(
        yaml.safe_dump({"workflow": "no_such_module:run", "tasks": {"train": str(tasks)}})
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentscope_rft.cli",
            "explore",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "no_such_module:run" in done.stderr and "does not import" in done.stderr


async def test_explore_runs_the_data_operators_before_the_buffer(calc_model_path, tmp_path):
    """`data.operators` filter what `explore` stores, as in a training run (they were ignored: a
    buffer filled for `train_only` held episodes the config's filters drop)."""
    from agentscope_rft.buffer import iter_stored_samples
    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.explore import explore

    tasks = tmp_path / "tasks.jsonl"
    rows = [{"id": "q0", "question": "What is (2+3)*4?", "answer": "20"}]
    rows.append(
        {"id": "q1", "question": "What is 2+2?", "answer": "7777"}
    )  # never solved: reward 0
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = load_config(
        None,
        [
            f"model.name_or_path={calc_model_path}",
            "engine.dtype=float32",
            "workflow=tests.integration.test_explorer:calc_workflow",
            f"tasks.train={tasks}",
            "explorer.group_size=2",
            "explorer.sampling.temperature=0.0",
            "data.operators=[{type: reward_range, min: 0.5}]",
        ],
    )
    summary = await explore(config, tmp_path / "explore")
    assert summary["data/reward_range/episodes_dropped"] == 2.0
    assert summary["data/reward_range/groups_dropped"] == 1.0
    stored = list(iter_stored_samples(tmp_path / "explore" / "buffer.db"))
    assert {s.task_id for s in stored} == {"q0"} and all(s.reward == 1.0 for s in stored)
    results = [
        json.loads(x) for x in (tmp_path / "explore" / "results.jsonl").read_text().splitlines()
    ]
    assert [r["rewards"] for r in results] == [[1.0, 1.0], [0.0, 0.0]]  # the workflow's own


async def test_exploring_again_into_a_folder_replaces_the_earlier_samples(
    tiny_model_path, tmp_path
):
    """An explore killed after its first task, then run again into the same folder: the buffer
    holds each task's group once (the killed run's groups stayed beside the new ones, so a
    `train_only` run from it trained the first task twice), like `results.jsonl`."""
    from collections import Counter

    from agentscope_rft.buffer import iter_stored_samples
    from agentscope_rft.runtime.explore import explore

    config = _two_task_config(tmp_path, tiny_model_path)
    out = tmp_path / "explore"
    await explore(config, out, limit=1)  # what a run killed after its first task left
    await explore(config, out)
    stored = Counter(s.task_id for s in iter_stored_samples(out / "buffer.db"))
    assert stored == {"t0": 2, "t1": 2}
    results = [json.loads(x)["task_id"] for x in (out / "results.jsonl").read_text().splitlines()]
    assert results == ["t0", "t1"]
    assert len((out / "diagnosis.jsonl").read_text().splitlines()) == 1  # this explore's


async def test_an_explore_killed_midway_leaves_no_summary_of_an_earlier_one(
    tiny_model_path, tmp_path, monkeypatch
):
    """A finished explore, then one killed after its first task into the same folder: the
    folder kept the first one's summary.json (all tasks, the earlier policy) beside the second
    one's partial results.jsonl."""
    import agentscope_rft.runtime.explore as explore_module

    one_task_at_a_time = "explorer.max_concurrency=2"
    config = _two_task_config(tmp_path, tiny_model_path, one_task_at_a_time)
    out = tmp_path / "explore"
    await explore_module.explore(config, out)
    assert (out / "summary.json").is_file()

    class Killed(Exception):
        """Where a kill -9 would end the process."""

    def killed(engine):
        raise Killed

    monkeypatch.setattr(explore_module, "check_engine", killed)  # after the first task's lines
    with pytest.raises(Killed):
        await explore_module.explore(config, out)
    assert len((out / "results.jsonl").read_text().splitlines()) == 1
    assert not (out / "summary.json").exists() and not (out / "diagnosis.jsonl").exists()


def _two_task_config(tmp_path, tiny_model_path, *extra: str):
    """Two toy tasks, groups of 2, on the tiny model."""
    from agentscope_rft.config import load_config

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"Say {i}"}) + "\n" for i in (0, 1))
    )
    overrides = [
        f"model.name_or_path={tiny_model_path}",
        "engine.dtype=float32",
        "workflow=tests/integration/toy_app.py:run",
        f"tasks.train={tasks}",
        "explorer.group_size=2",
        "explorer.sampling.max_tokens=4",
    ]
    return load_config(None, [*overrides, *extra])
