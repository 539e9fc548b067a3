"""`run.mode: train_only`: train from a SQL buffer other processes fill; resume after a crash."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from agentscope_rft.buffer.sql import SQLBuffer
from agentscope_rft.config import load_config
from agentscope_rft.explorer.trajectory import EPISODE_REWARD, EPISODE_SUCCESS
from agentscope_rft.runtime.components import write_state
from agentscope_rft.runtime.local import train
from agentscope_rft.types import Sample


def groups(num_groups: int, vocab: int = 2000) -> list[list[Sample]]:
    """Task groups of four episodes with different rewards (none is filtered as zero-variance)."""
    rng = random.Random(0)
    out = []
    for g in range(num_groups):
        group = []
        for e in range(4):
            ids = [rng.randrange(100, vocab) for _ in range(12)]
            group.append(
                Sample(
                    token_ids=ids,
                    loss_mask=[0] * 4 + [1] * 8,
                    logprobs=[0.0] * 4 + [-1.0] * 8,
                    reward=float(e),
                    rollout_id=f"r{g}.{e}",
                    task_id=f"t{g}",
                    group_id=f"g{g}",
                    sample_id=f"g{g}.{e}",
                )
            )
        out.append(group)
    return out


async def fill(url: str, num_groups: int) -> None:
    buffer = SQLBuffer(url)
    for group in groups(num_groups):
        await buffer.put(group)
    await buffer.close()


def config(model: str, url: str, run_dir: Path, steps: int, max_staleness: int = 100):
    return load_config(
        None,
        [
            f"model.name_or_path={model}",
            "run.mode=train_only",
            "buffer.type=sql",
            f"buffer.url={url}",
            "explorer.tasks_per_step=1",
            "trainer.dtype=float32",
            "trainer.lr=1e-3",
            f"run.steps={steps}",
            "run.checkpoint_every=1",
            "run.get_timeout=5",
            f"run.max_staleness={max_staleness}",  # the groups were explored by version 0
            f"run.dir={run_dir}",
            "run.name=train-only",
            "monitor.tensorboard=false",
        ],
    )


@pytest.fixture
def trained(monkeypatch) -> list[tuple[int, list[str]]]:
    """What each trainer step trained (the real trainer, wrapped)."""
    import agentscope_rft.runtime.training as local

    log: list[tuple[int, list[str]]] = []
    build = local.build_trainer

    class Recording:
        def __init__(self, trainer) -> None:
            self._trainer = trainer

        def step(self, samples, step):
            log.append((step, sorted(s.sample_id for s in samples)))
            return self._trainer.step(samples, step)

        def __getattr__(self, name):
            return getattr(self._trainer, name)

    monkeypatch.setattr(local, "build_trainer", lambda *a, **k: Recording(build(*a, **k)))
    return log


async def test_train_only_trains_the_buffer_in_order_and_resumes_a_lost_step(
    tiny_model_path, tmp_path, trained
):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    await fill(url, 4)
    run_dir = tmp_path / "run"
    await train(config(tiny_model_path, url, run_dir, 3), run_dir)
    assert trained == [(s, [f"g{s}.{e}" for e in range(4)]) for s in range(3)]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows if "policy_version" in r] == [1.0, 2.0, 3.0]

    # The process died after step 2 took its group but before that step's checkpoint: the last
    # checkpoint says 2 steps. The resumed run trains step 2 again, on the same group.
    write_state(run_dir, {"step": 2})
    trained.clear()
    await train(config(tiny_model_path, url, run_dir, 4), run_dir, resume=True)
    assert trained == [(2, [f"g2.{e}" for e in range(4)]), (3, [f"g3.{e}" for e in range(4)])]
    buffer = SQLBuffer(url, create=False)
    stats = await buffer.stats()
    await buffer.close()
    assert stats["consumed_groups"] == 4 and stats["pending_groups"] == 0


async def test_train_only_waits_for_the_buffer_and_says_what_it_waits_for(
    tiny_model_path, tmp_path
):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    await fill(url, 0)
    run_dir = tmp_path / "run"
    with pytest.raises(Exception, match=r"1 group"):
        await train(config(tiny_model_path, url, run_dir, 1), run_dir)


async def test_groups_older_than_the_staleness_bound_are_dropped_and_the_error_names_the_bound(
    tiny_model_path, tmp_path
):
    """An explorer that serves version 0 (a baseline `explore`): from step 3 on, with
    `run.max_staleness: 2`, its groups are too old; the error names the bound, and the groups
    stay in the buffer (dropped, not lost)."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    await fill(url, 5)
    run_dir = tmp_path / "run"
    with pytest.raises(Exception, match=r"run\.max_staleness=2 behind the trainer's 3") as error:
        await train(config(tiny_model_path, url, run_dir, 4, max_staleness=2), run_dir)
    assert "policy versions >= 1" in str(error.value)
    buffer = SQLBuffer(url, create=False)
    stats = await buffer.stats()
    await buffer.close()
    assert (stats["consumed_groups"], stats["dropped_groups"], stats["pending_groups"]) == (3, 2, 0)


async def test_train_only_logs_the_reward_metrics_of_the_episodes_it_trains(
    tiny_model_path, tmp_path
):
    """Each step logs `reward/*` and `success_rate` of its episodes, as an exploring step does:
    one value per rollout (a rollout of two samples counts once), the workflow's reward even
    where the sample's `reward` is 0 (`explorer.reward_spread: last_call`)."""
    rewards = [[0.0, 0.5, 1.0, 1.0], [0.0, 0.0, 0.25, 1.0]]
    buffer = SQLBuffer(f"sqlite:///{tmp_path / 'shared.db'}")
    for g, group in enumerate(groups(2)):
        spread = []
        for e, sample in enumerate(group):
            marks = {EPISODE_REWARD: rewards[g][e], EPISODE_SUCCESS: float(rewards[g][e] >= 1)}
            spread.append(dataclasses.replace(sample, reward=0.0, metrics=marks))
        # the second sample of episode 0 (a second agent): the same episode, counted once
        spread.append(dataclasses.replace(spread[0], sample_id=f"g{g}.0b"))
        await buffer.put(spread)
    await buffer.close()
    run_dir = tmp_path / "run"
    await train(config(tiny_model_path, f"sqlite:///{tmp_path / 'shared.db'}", run_dir, 2), run_dir)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if r.get("phase") == "train" and "reward/mean" in r]
    assert [r["step"] for r in logged] == [0, 1]
    for row, values in zip(logged, rewards, strict=True):
        mean = sum(values) / 4
        assert row["reward/mean"] == pytest.approx(mean)
        assert row["reward/std"] == pytest.approx((sum((v - mean) ** 2 for v in values) / 4) ** 0.5)
        assert (row["reward/min"], row["reward/max"]) == (min(values), max(values))
        assert row["success_rate"] == pytest.approx(sum(v >= 1 for v in values) / 4)


async def test_each_step_logs_the_stale_groups_it_dropped(tiny_model_path, tmp_path, trained):
    """With `run.max_staleness: 1`, step 2 trains versions >= 1: the third group (explored by
    version 0) is dropped on the way to the fourth (version 2), and step 2's metrics count it."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    buffer = SQLBuffer(url)
    for g, group in enumerate(groups(4)):
        version = 2 if g == 3 else 0
        await buffer.put([dataclasses.replace(s, policy_version=version) for s in group])
    await buffer.close()
    run_dir = tmp_path / "run"
    await train(config(tiny_model_path, url, run_dir, 3, max_staleness=1), run_dir)
    assert [ids[0] for _, ids in trained] == ["g0.0", "g1.0", "g3.0"]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "train"]
    dropped = [(r["buffer/stale_groups_dropped"], r["buffer/stale_samples_dropped"]) for r in steps]
    assert dropped == [(0.0, 0.0), (0.0, 0.0), (1.0, 4.0)]
    # the trainer's view: step 1 trained samples one version behind it, step 2 fresh ones
    assert [r["train/staleness_max"] for r in steps] == [0.0, 1.0, 0.0]
