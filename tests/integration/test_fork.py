"""Forking a real run at a checkpoint: with the same config the fork repeats the run exactly;
with another config it trains on from the shared steps; a sweep forks each seed (`--fork-from`)."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentscope_rft.config import load_config
from agentscope_rft.runtime.fork import fork_run
from agentscope_rft.runtime.local import train

from .test_train_loop import final_weights, toy_config

ROOT = Path(__file__).resolve().parents[2]
# deterministic: the engine's batching (timing) must not flip a sampled token between runs
EXTRA = (
    "run.steps=3",
    "run.eval_every=1",
    "run.checkpoint_every=1",
    "run.keep_checkpoints=4",
    "trainer.lr=1e-2",
    "trainer.old_logprobs=recompute",
    "run.deterministic=true",
    "explorer.tasks_per_step=2",
    "explorer.group_size=4",
)


def records(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def source(tiny_model_path, toy_tasks, tmp_path_factory) -> Path:
    """One 3-step run both fork tests start from (a checkpoint every step)."""
    run = tmp_path_factory.mktemp("fork") / "source"
    config = toy_config(tiny_model_path, toy_tasks, run, *EXTRA, f"tasks.val={toy_tasks}")
    asyncio.run(train(config, run))
    return run


async def test_a_fork_with_the_same_config_repeats_the_run(
    source, tiny_model_path, toy_tasks, tmp_path
):
    fork = tmp_path / "fork"
    # the source's resolved config (its engine threads fixed by run.deterministic included)
    config = load_config(source / "config.yaml", [f"run.dir={fork}", "run.name=fork"])
    assert fork_run(source, 1, fork, config)["differences"] == []
    await train(load_config(fork / "config.yaml"), fork, resume=True)

    a, b = final_weights(source, 3), final_weights(fork, 3)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    rows = records(fork)
    assert [r["step"] for r in rows if r["phase"] == "train"] == [0, 1, 2]
    assert [r["step"] for r in rows if r["phase"] == "val"] == [0, 1, 2, 3]
    # the validation of step 1 is the source's (copied, not run again), later ones the fork's
    theirs = {r["step"]: r for r in records(source) if r["phase"] == "val"}
    ours = {r["step"]: r for r in rows if r["phase"] == "val"}
    assert ours[1]["time"] == theirs[1]["time"] and ours[2]["time"] != theirs[2]["time"]
    assert ours[3]["reward/mean"] == theirs[3]["reward/mean"]
    val_rollouts = [r for r in records(fork, "rollouts.jsonl") if r["phase"] == "val"]
    assert len(val_rollouts) == 4 * 16  # steps 0-3, 16 tasks each, none twice


async def test_a_fork_with_another_config_trains_on_from_the_shared_steps(source, tmp_path):
    before = (source / "metrics.jsonl").read_bytes()
    fork = tmp_path / "fork"
    config = load_config(source / "config.yaml", [f"run.dir={fork}", "trainer.lr=1e-1"])
    record = fork_run(source, 2, fork, config)
    assert record["differences"] == ["trainer.lr: 0.01 -> 0.1"]
    # as if the source had been killed while validating step 2: that validation is run first
    kept = [r for r in records(fork) if (r["step"], r["phase"]) != (2, "val")]
    (fork / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    await train(load_config(fork / "config.yaml"), fork, resume=True)
    a, b = final_weights(source, 3), final_weights(fork, 3)
    assert any(not torch.equal(a[name], b[name]) for name in a)
    assert [r["step"] for r in records(fork) if r["phase"] == "train"] == [0, 1, 2]
    assert [r["step"] for r in records(fork) if r["phase"] == "val"] == [0, 1, 2, 3]
    assert (source / "metrics.jsonl").read_bytes() == before


def test_a_sweep_forks_each_seed_from_the_same_seed_of_another(
    tiny_model_path, toy_tasks, tmp_path
):
    sets = [
        f"model.name_or_path={tiny_model_path}",
        f"workflow={ROOT / 'tests/integration/toy_app.py'}:run",
        f"tasks.train={toy_tasks}",
        "explorer.group_size=2",
        "explorer.tasks_per_step=2",
        "explorer.sampling.max_tokens=8",
        "engine.dtype=float32",
        "trainer.dtype=float32",
        "run.steps=2",
        "run.checkpoint_every=1",
        "monitor.tensorboard=false",
    ]
    cli = [sys.executable, "-m", "agentscope_rft.cli", "train", "--seeds", "0"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [*cli, *(x for s in [*sets, *args] for x in ("--set", s))]
        if "run.name=arm" in args:
            command += ["--fork-from", str(tmp_path / "src"), "--fork-step", "1"]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)

    first = run(f"run.dir={tmp_path / 'src'}", "run.name=src")
    assert first.returncode == 0, first.stderr[-3000:]
    arm = run(f"run.dir={tmp_path / 'arm'}", "run.name=arm", "trainer.lr=1e-3")
    assert arm.returncode == 0, arm.stderr[-3000:]
    seed = tmp_path / "arm" / "seed-0"
    forked = json.loads((seed / "fork.json").read_text())
    assert forked["step"] == 1 and forked["source"] == str((tmp_path / "src/seed-0").resolve())
    assert forked["differences"] == ["trainer.lr: 1e-06 -> 0.001"]
    assert json.loads((seed / "state.json").read_text())["step"] == 2
    assert [r["step"] for r in records(seed) if r["phase"] == "train"] == [0, 1]
    theirs = [r for r in records(tmp_path / "src/seed-0") if r["phase"] == "train"]
    assert next(r for r in records(seed) if r["phase"] == "train") == theirs[0]
    sweep = json.loads((tmp_path / "arm" / "sweep.json").read_text())
    assert sweep["fork"]["step"] == 1 and sweep["status"] == {"0": "done"}
