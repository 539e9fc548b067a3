"""`runtime: ray` end to end: the quickstart on a two-node cluster; bad configs fail early."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentscope_rft.config import load_config
from agentscope_rft.runtime.local import train
from agentscope_rft.runtime.ray import RayClusterError

ray = pytest.importorskip("ray")

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart"


def quickstart(model: str, tmp_path: Path, *extra: str):
    tasks = tmp_path / "tasks.jsonl"
    lines = (QUICKSTART / "tasks_train.jsonl").read_text().splitlines()[:4]
    tasks.write_text("\n".join(lines) + "\n")
    return load_config(
        QUICKSTART / "config.yaml",
        [
            f"model.name_or_path={model}",
            f"tasks.train={tasks}",
            "tasks.eval=null",
            "run.eval_every=0",
            "run.steps=2",
            f"run.dir={tmp_path / 'run'}",
            "explorer.group_size=2",
            "explorer.tasks_per_step=2",
            "explorer.sampling.max_tokens=8",
            "engine.dtype=float32",
            "trainer.dtype=float32",
            "monitor.tensorboard=false",
            "runtime.type=ray",
            *extra,
        ],
    )


@pytest.mark.slow
async def test_quickstart_trains_two_steps_on_a_two_node_cluster(
    ray_cluster, tiny_model_path, tmp_path
):
    config = quickstart(
        tiny_model_path,
        tmp_path,
        f"runtime.address={ray_cluster}",
        "runtime.runners=2",
        "runtime.runner_cpus=0.25",
        "runtime.episodes_per_runner=2",
    )
    last = await train(config, tmp_path / "run")

    assert not ray.is_initialized()  # the run disconnected from the cluster it joined
    assert last["policy_version"] == 2.0
    assert (tmp_path / "run" / "checkpoints" / "step-000002" / "model").is_dir()
    rows = [json.loads(x) for x in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 and all(r["status"] == "ok" for r in rows)
    runners = {r["runner"] for r in rows}
    assert len(runners) == 2  # two runner processes ...
    assert len({r.split("/")[0] for r in runners}) == 2  # ... on the two nodes (spread)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [m for m in metrics if m.get("phase") == "train"]
    assert [m["runtime/runners"] for m in train_rows] == [2.0, 2.0]
    assert all(m["runtime/runner_deaths"] == 0 for m in train_rows)


@pytest.mark.slow
async def test_the_local_runtime_is_unchanged(tiny_model_path, tmp_path):
    config = quickstart(tiny_model_path, tmp_path, "runtime.type=local", "run.steps=1")
    await train(config, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert {r["runner"].split("/")[0] for r in rows} == {"local"}
    assert not ray.is_initialized()


async def test_an_unreachable_address_fails_before_any_work(tiny_model_path, tmp_path):
    config = quickstart(tiny_model_path, tmp_path, "runtime.address=127.0.0.1:9")
    with pytest.raises(
        RayClusterError, match=r"no Ray cluster answers at 127\.0\.0\.1:9.*ray start"
    ):
        await train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("runtime.runner_gpus=1", r"2 GPUs \(runners: 2 x runner_gpus 1\) but it has 0"),
        ("runtime.runners=9", r"2\.25 CPUs \(runners: 9 x runner_cpus 0\.25\) but it has 2"),
        # vLLM replicas count too: their GPUs, their CPUs next to the runners', one node each
        (
            "engine.type=vllm engine.replicas=2 runtime.replica_gpus=1 runtime.replica_cpus=0",
            r"2 GPUs \(vLLM: 2 replica\(s\) x 1 GPU\(s\)\) but it has 0",
        ),
        (
            "engine.type=vllm engine.replicas=2",
            r"2\.5 CPUs \(runners: 2 x runner_cpus 0\.25; vLLM: 2 replica\(s\) x replica_cpus 1\)",
        ),
        (
            "engine.type=vllm runtime.replica_cpus=1.5",
            r"replica_cpus 1\.5: each needs 1\.5 CPUs on one node, but the largest node .* has 1",
        ),
        (
            "engine.type=vllm runtime.replica_nodes=[nowhere]",
            r"runtime\.replica_nodes: no live node of the Ray cluster is 'nowhere'",
        ),
    ],
)
async def test_more_than_the_cluster_has_fails_before_any_work(
    ray_cluster, tiny_model_path, tmp_path, setting, message
):
    config = quickstart(
        tiny_model_path,
        tmp_path,
        f"runtime.address={ray_cluster}",
        "runtime.runner_cpus=0.25",
        *setting.split(),
    )
    with pytest.raises(RayClusterError, match=message):
        await train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert not ray.is_initialized()


@pytest.mark.slow
async def test_explore_runs_its_episodes_in_runners(ray_cluster, tiny_model_path, tmp_path):
    from agentscope_rft.runtime.explore import explore

    config = quickstart(
        tiny_model_path, tmp_path, f"runtime.address={ray_cluster}", "runtime.runner_cpus=0.25"
    )
    summary = await explore(config, tmp_path / "explore", limit=2, group_size=2)
    assert summary["explore/rollouts"] == 4 and summary["explore/failed"] == 0
    rows = [
        json.loads(x) for x in (tmp_path / "explore" / "rollouts.jsonl").read_text().splitlines()
    ]
    assert all(not r["runner"].startswith("local/") for r in rows)
    assert not ray.is_initialized()


@pytest.mark.slow
async def test_rewards_from_runners_update_the_weights(ray_cluster, tiny_model_path, tmp_path):
    """The quickstart's tiny-model episodes all score 0 (no update); the toy task's vary."""
    import torch
    from safetensors.torch import load_file

    tasks = tmp_path / "toy.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"Say {i}"}) + "\n" for i in range(4))
    )
    config = quickstart(
        tiny_model_path,
        tmp_path,
        "workflow=tests/integration/toy_app.py:run",
        f"tasks.train={tasks}",
        "tasks.id_field=id",
        "explorer.group_size=4",
        "trainer.lr=5e-2",
        f"runtime.address={ray_cluster}",
        "runtime.runner_cpus=0.25",
    )
    last = await train(config, tmp_path / "run")
    assert last["reward/std"] > 0 and "loss" in last
    before = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    after = load_file(str(tmp_path / "run/checkpoints/step-000002/model/model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
async def test_without_an_address_the_run_starts_and_stops_its_own_cluster(
    ray_cluster, tiny_model_path, tmp_path
):
    """Even with another cluster on this machine (the test cluster), the run starts its own."""
    from .conftest import _raylets

    before = _raylets()
    config = quickstart(
        tiny_model_path,
        tmp_path,
        "run.steps=1",
        "runtime.num_cpus=1",
        "runtime.runners=1",
        "runtime.runner_cpus=0.5",
    )
    await train(config, tmp_path / "run")
    assert not ray.is_initialized()
    assert _raylets() <= before  # its raylet is gone, the other cluster's are untouched
    assert before & _raylets() == before
    rows = [json.loads(x) for x in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" and not r["runner"].startswith("local/") for r in rows)
