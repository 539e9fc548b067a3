"""Demonstrations in an exploring run: SFT warm-up steps before exploring, and the CHORD mix."""

import asyncio
import json
from pathlib import Path

import pytest
import torch

from agentscope_rft.config import load_config
from agentscope_rft.explorer.tasks import TaskSetError
from agentscope_rft.runtime.local import train
from agentscope_rft.runtime.preflight import preflight

APP = "tests/integration/toy_app.py:run"
DEMOS = Path(__file__).resolve().parents[1] / "data" / "sft_tiny.jsonl"


def config(model: str, tmp_path: Path, *extra: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"Say {i}"}) + "\n" for i in range(8))
    )
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
            "trainer.lr=1e-3",
            f"offline.path={DEMOS}",
            "offline.batch_size=2",
            f"run.dir={tmp_path / 'run'}",
            "run.name=warm",
            "monitor.tensorboard=false",
            *extra,
        ],
    )


def rows(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (run_dir / name).read_text().splitlines()]


async def test_warmup_steps_train_the_demonstrations_then_explore(tiny_model_path, tmp_path):
    cfg = config(tiny_model_path, tmp_path, "offline.warmup_steps=2", "run.steps=4")
    last = await train(cfg, tmp_path / "run")
    assert last["policy_version"] == 4.0
    train_rows = [r for r in rows(tmp_path / "run", "metrics.jsonl") if r.get("phase") == "train"]
    by_step = {r["step"]: r for r in train_rows if "train/samples" in r}
    assert sorted(by_step) == [0, 1, 2, 3]
    for step in (0, 1):  # SFT on 2 demonstrations, no episode, no reward
        assert by_step[step]["train/samples"] == 2.0
        assert "sft/loss" in by_step[step] and "reward/mean" not in by_step[step]
    assert by_step[1]["sft/loss"] < by_step[0]["sft/loss"]
    for step in (2, 3):  # then GRPO on 2 tasks x 4 episodes
        assert by_step[step]["train/samples"] == 8.0
        assert "reward/mean" in by_step[step] and "sft/loss" not in by_step[step]
    rollouts = rows(tmp_path / "run", "rollouts.jsonl")
    assert sorted({r["step"] for r in rollouts}) == [2, 3]
    # The first batch was explored with the warmed-up policy (version 2), not the initial one.
    first = [c["policy_version"] for r in rollouts if r["step"] == 2 for c in r["calls"]]
    assert first and set(first) == {2}


async def test_sft_rl_mix_trains_demonstrations_beside_every_rl_batch(tiny_model_path, tmp_path):
    cfg = config(
        tiny_model_path,
        tmp_path,
        "algorithm.objective=sft_rl_mix",
        "algorithm.sft_mix.mu_peak=0.5",
        "algorithm.sft_mix.mu_valley=0.5",
        "run.steps=2",
    )
    await train(cfg, tmp_path / "run")
    steps = [r for r in rows(tmp_path / "run", "metrics.jsonl") if "train/samples" in r]
    assert len(steps) == 2
    for row in steps:  # 8 episodes + 2 demonstrations, both losses
        assert row["train/samples"] == 10.0
        assert "sft/loss" in row and "reward/mean" in row


async def test_sft_rl_mix_trains_the_demonstrations_when_every_group_is_equal(
    tiny_model_path, tmp_path
):
    # An SFT-only control (mu 1.0) whose explored groups all score the same: the step drops
    # every RL group and trains its demonstrations (it once failed on an empty RL batch).
    tasks = tmp_path / "solved.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"id": f"s{i}", "prompt": "Hi", "kind": "solved"}) + "\n" for i in range(4)
        )
    )
    cfg = config(
        tiny_model_path,
        tmp_path,
        "workflow=tests/integration/toy_app.py:by_kind",
        f"tasks.train={tasks}",
        "algorithm.objective=sft_rl_mix",
        "algorithm.sft_mix.mu_peak=1.0",
        "algorithm.sft_mix.mu_valley=1.0",
        "run.steps=2",
    )
    last = await train(cfg, tmp_path / "run")
    assert last["policy_version"] == 2.0  # both steps updated the weights
    steps = [r for r in rows(tmp_path / "run", "metrics.jsonl") if "train/samples" in r]
    assert len(steps) == 2
    for row in steps:  # both groups equal and dropped; the 2 demonstrations train
        assert row["train/zero_variance_groups"] == 2.0 and row["reward/mean"] == 1.0
        assert row["train/samples"] == 2.0 and "train/skipped" not in row
        assert torch.isfinite(torch.tensor([row["sft/loss"], row["loss"]])).all()


@pytest.mark.parametrize(
    ("extra", "error", "match"),
    [
        (["offline.warmup_steps=2", "run.steps=2"], ValueError, "fewer than run.steps"),
        (["offline.warmup_steps=1", "offline.path=null"], ValueError, "set `offline.path`"),
        (["offline.warmup_steps=1", "trainer.type=verl"], ValueError, "torch trainer"),
        (["algorithm.objective=sft_rl_mix", "offline.path=null"], ValueError, "sft_rl_mix"),
        (["offline.warmup_steps=1", "offline.format=dpo"], ValueError, "offline.format 'sft'"),
    ],
)
def test_bad_demonstration_settings_are_refused(tmp_path, extra, error, match):
    with pytest.raises(error, match=match):
        config("tiny", tmp_path, "run.steps=3", *extra)


def test_a_missing_demonstration_file_is_named_before_the_engine_loads(tmp_path):
    cfg = config("tiny", tmp_path, "offline.warmup_steps=1", "run.steps=3")
    cfg.offline.path = str(tmp_path / "nowhere.jsonl")
    with pytest.raises(TaskSetError, match=r"nowhere\.jsonl does not exist"):
        preflight(cfg)


async def test_a_broken_demonstration_file_fails_before_exploring(tiny_model_path, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    cfg = config(tiny_model_path, tmp_path, "offline.warmup_steps=1", "run.steps=2")
    cfg.offline.path = str(broken)
    with pytest.raises(ValueError, match=r"broken\.jsonl"):
        await train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "rollouts.jsonl").exists()


async def test_a_run_killed_during_the_warmup_resumes_with_the_next_demonstrations(
    tiny_model_path, tmp_path
):
    from safetensors.torch import load_file

    extra = ("offline.warmup_steps=3", "run.steps=4", "run.checkpoint_every=1")
    extra += ("run.keep_checkpoints=4", "run.deterministic=true")  # batching follows timing
    straight = config(tiny_model_path, tmp_path / "a", *extra)
    await train(straight, Path(straight.run.dir))
    killed = config(tiny_model_path, tmp_path / "b", *extra)
    run_dir = Path(killed.run.dir)
    job = asyncio.create_task(train(killed, run_dir))
    state = run_dir / "state.json"
    while not (state.is_file() and json.loads(state.read_text())["step"] == 1):
        assert not job.done(), job.exception()
        await asyncio.sleep(0.05)
    job.cancel()  # as a kill would, after the first warm-up step's checkpoint
    with pytest.raises(asyncio.CancelledError):
        await job
    await train(load_config(run_dir / "config.yaml"), run_dir, resume=True)

    def weights(run: Path, step: int) -> dict:
        return load_file(
            str(run / "checkpoints" / f"step-{step:06d}" / "model" / "model.safetensors")
        )

    # The resumed warm-up trained the same demonstrations in the same order: same weights.
    a, b = weights(Path(straight.run.dir), 3), weights(run_dir, 3)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert sorted({r["step"] for r in rows(run_dir, "rollouts.jsonl")}) == [3]
