"""Run health end to end on a tiny model: rollbacks restore exactly, the cap stops the run, a
forced entropy collapse is caught, and the best checkpoint is chosen on validation only."""

import json
from pathlib import Path

import pytest
import torch

from agentscope_rft.config import load_config
from agentscope_rft.health import read_events
from agentscope_rft.monitor.records import per_step, read_metrics, surviving_history
from agentscope_rft.runtime.local import train
from agentscope_rft.runtime.signals import RunStopped

from .test_train_loop import final_weights, toy_config

RULES = "tests/integration/health_rules.py"


def train_records(run_dir: Path) -> list:
    return per_step(surviving_history(read_metrics(run_dir / "metrics.jsonl")), "train")


def forced_rule(rule: str, step: int, onset: int, flag: Path) -> list[str]:
    custom = [
        {
            "path": f"{RULES}:{rule}",
            "action": "rollback",
            "params": {"step": step, "onset": onset, "flag": str(flag)},
        }
    ]
    return [f"health.custom={json.dumps(custom)}"]


EXACT = (
    "run.steps=4",
    "run.checkpoint_every=1",
    "trainer.lr=1e-2",
    # engine log-probs depend (at 1e-7) on which requests shared a batch: the ratio uses the
    # trainer's own, as the exact-resume test does; and deterministic, so that batching (timing)
    # cannot flip a sampled token either (this failed under load without it)
    "trainer.old_logprobs=recompute",
    "run.deterministic=true",
)
REPLAY = 'buffer.replay={"ratio": 0.5, "max_reuse": 1}'
"""Replayed groups too: the abandoned steps' groups must not be replayed after the rollback
(they were), nor their replays count against a group's reuse."""


@pytest.mark.parametrize(("fires_at", "target", "replay"), [(2, 1, True), (1, 0, False)])
async def test_a_rollback_restores_weights_optimizer_and_task_position_exactly(
    tiny_model_path, toy_tasks, tmp_path, fires_at, target, replay
):
    exact = [*EXACT, REPLAY] if replay else list(EXACT)
    straight, rolled = tmp_path / "straight", tmp_path / "rolled"
    await train(toy_config(tiny_model_path, toy_tasks, straight, *exact), straight)
    # The rule fires once after step `fires_at`, its streak starting there: the run goes back to
    # the checkpoint before (its policy was watched and broke nothing; step 0: the starting
    # weights), with no change.
    rule = forced_rule("once_at", fires_at, fires_at, tmp_path / "f")
    extra = [*exact, "health.rollback.lr_factor=1", *rule]
    await train(toy_config(tiny_model_path, toy_tasks, rolled, *extra), rolled)

    [event] = [e for e in read_events(rolled) if e.rule == "once_at"]
    assert (event.rule, event.action, event.step, event.rolled_back_to) == (
        "once_at",
        "rollback",
        fires_at,
        target,
    )
    a, b = final_weights(straight, 4), final_weights(rolled, 4)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)  # optimizer and tasks too
    kept = train_records(rolled)
    assert [r.step for r in kept] == [0, 1, 2, 3]  # the redone steps supersede the first try
    assert [r.metrics["reward/mean"] for r in kept] == pytest.approx(
        [r.metrics["reward/mean"] for r in train_records(straight)]
    )
    lines = [json.loads(x) for x in (rolled / "metrics.jsonl").read_text().splitlines()]
    assert {"step": target, "phase": "resume"}.items() <= next(
        x for x in lines if x["phase"] == "resume"
    ).items()
    assert json.loads((rolled / "state.json").read_text())["health"]["rollbacks"] == 1


async def test_the_rollback_cap_stops_the_run_and_changes_hold(
    tiny_model_path, toy_tasks, tmp_path
):
    run_dir = tmp_path / "run"
    extra = [
        "run.steps=5",
        "run.checkpoint_every=1",
        "trainer.lr=1e-2",
        "health.rollback.max_rollbacks=1",
        "health.rollback.lr_factor=0.5",
        *forced_rule("always_at", 2, 2, tmp_path / "unused"),
    ]
    with pytest.raises(RunStopped, match=r"max_rollbacks") as stopped:
        await train(toy_config(tiny_model_path, toy_tasks, run_dir, *extra), run_dir)
    assert "health.jsonl" in str(stopped.value) and "--resume" in str(stopped.value)
    events = [e for e in read_events(run_dir) if e.rule == "always_at"]
    assert [(e.step, e.rolled_back_to) for e in events] == [(2, 1), (2, None)]
    lrs = {r.step: r.metrics["lr"] for r in train_records(run_dir)}
    # steps 1 and 2 were redone at half the learning rate (the schedule is constant)
    assert lrs[0] == pytest.approx(1e-2) and lrs[1] == lrs[2] == pytest.approx(5e-3)
    state = json.loads((run_dir / "state.json").read_text())
    assert state["step"] == 3 and state["health"]["lr_scale"] == 0.5
    # A resumed run keeps the halved learning rate
    config = load_config(run_dir / "config.yaml", ["health.custom=[]"])
    await train(config, run_dir, resume=True)
    assert train_records(run_dir)[-1].metrics["lr"] == pytest.approx(5e-3)


async def test_a_forced_entropy_collapse_is_caught_and_rolled_back(
    tiny_model_path, toy_tasks, tmp_path
):
    # At lr 0.3 the tiny model's entropy falls from 10.8 to ~1 by step 2, after which every
    # reply is the same (measured); the rule (baseline: step 0) catches it and the run goes on
    # from the step-1 checkpoint at a tenth of the learning rate.
    run_dir = tmp_path / "run"
    extra = [
        "run.steps=5",
        "run.checkpoint_every=1",
        "trainer.lr=0.3",
        "run.deterministic=true",  # which requests share a batch (timing) cannot move the fall
        "health.rules.entropy_collapse.action=rollback",
        "health.rules.entropy_collapse.baseline_steps=1",
        "health.rules.entropy_collapse.fraction=0.2",
        "health.rules.entropy_collapse.patience=1",
        "health.rollback.lr_factor=0.1",
        "health.rollback.max_rollbacks=3",
    ]
    await train(toy_config(tiny_model_path, toy_tasks, run_dir, *extra), run_dir)
    events = [e for e in read_events(run_dir) if e.rule == "entropy_collapse"]
    assert events and events[0].action == "rollback"
    first = events[0]
    assert first.value < first.threshold and first.rolled_back_to is not None
    assert first.rolled_back_to < first.onset <= first.step
    kept = train_records(run_dir)
    assert [r.step for r in kept] == [0, 1, 2, 3, 4]
    after = [r for r in kept if r.step >= first.rolled_back_to]
    assert all(r.metrics["lr"] <= 0.03 + 1e-9 for r in after)


async def test_the_best_checkpoint_is_chosen_on_validation_only(
    tiny_model_path, toy_tasks, tmp_path
):
    from agentscope_rft.runtime.best import read_best, resolve_checkpoint
    from agentscope_rft.runtime.explore import explore

    val, test = tmp_path / "val.jsonl", tmp_path / "test.jsonl"
    val.write_text(
        "".join(
            json.dumps({"id": f"v{i}", "prompt": f"Say it {i}", "kind": "ab"[i >= 4]}) + "\n"
            for i in range(6)
        )
    )
    test.write_text(
        "".join(
            json.dumps({"id": f"x{i}", "prompt": f"Tell {i}", "kind": "ab"[i % 2]}) + "\n"
            for i in range(4)
        )
    )
    run_dir = tmp_path / "run"
    extra = [
        "run.steps=3",
        "run.eval_every=1",
        "run.keep_checkpoints=1",
        "run.checkpoint_every=1",
        f"tasks.val={val}",
        "tasks.val_limit=4",
        "tasks.stratify_field=kind",
        f"tasks.test={test}",
        "run.best_metric=val/reward/mean",
    ]
    await train(toy_config(tiny_model_path, toy_tasks, run_dir, *extra), run_dir)
    records = surviving_history(read_metrics(run_dir / "metrics.jsonl"))
    val_rewards = {r.step: r.metrics["reward/mean"] for r in per_step(records, "val")}
    assert sorted(val_rewards) == [0, 1, 2, 3]
    best = read_best(run_dir)
    assert best is not None and best["metric"] == "val/reward/mean"
    assert best["value"] == max(val_rewards.values())
    assert val_rewards[best["step"]] == best["value"]  # the first step that reached it
    assert min(s for s, v in val_rewards.items() if v == best["value"]) == best["step"]
    folders = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert folders == ["best", "step-000003"]  # keep_checkpoints: 1 never deletes best
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert not any(r["task_id"].startswith("x") for r in rollouts)  # the test split: never
    # the slice keeps both kinds' shares (4 a, 2 b -> 3 a, 1 b), and each kind is a metric
    assert {r["task_id"] for r in rollouts if r["phase"] == "val"} == {"v0", "v1", "v2", "v4"}
    for record in per_step(records, "val"):
        kinds = record.metrics["reward/by_kind/a"], record.metrics["reward/by_kind/b"]
        assert record.metrics["reward/mean"] == pytest.approx((3 * kinds[0] + kinds[1]) / 4)
    # the best checkpoint is a model `explore` (and serve) can load
    config = load_config(run_dir / "config.yaml")
    config.model.name_or_path = str(resolve_checkpoint("best", run_dir))
    summary = await explore(config, tmp_path / "on-test", split="test", limit=2)
    assert summary["explore/rollouts"] == 2
    assert {"reward/by_kind/a", "reward/by_kind/b"} <= set(summary)


async def test_a_best_checkpoint_of_abandoned_steps_gives_way_to_the_best_kept(
    tiny_model_path, toy_tasks, tmp_path
):
    from agentscope_rft.runtime.best import read_best

    # The third validation (step 2, the policy the rule then finds unhealthy) scores 1, every
    # other 0: the rollback to step 1 abandons it, so the best is a kept validation.
    val = tmp_path / "val.jsonl"
    val.write_text(
        "".join(
            json.dumps({"id": f"v{i}", "prompt": f"Hi {i}", "val_tasks": 2}) + "\n"
            for i in range(2)
        )
    )
    run_dir = tmp_path / "run"
    extra = [
        "workflow=tests/integration/toy_app.py:peak_at_third_validation",
        "run.steps=4",
        "run.eval_every=1",
        "run.checkpoint_every=1",
        f"tasks.val={val}",
        *forced_rule("once_at", 2, 2, tmp_path / "f"),
    ]
    await train(toy_config(tiny_model_path, toy_tasks, run_dir, *extra), run_dir)
    records = surviving_history(read_metrics(run_dir / "metrics.jsonl"))
    kept = {r.step: r.metrics["reward/mean"] for r in per_step(records, "val")}
    assert kept == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}
    best = read_best(run_dir)
    assert best is not None and best["value"] == 0.0 and best["step"] <= 1
    assert (run_dir / "checkpoints" / "best" / "model" / "config.json").is_file()


async def test_a_second_rollback_to_before_the_first_ones_target_finds_its_checkpoint(
    tiny_model_path, toy_tasks, tmp_path
):
    """The default run.keep_checkpoints (2): after a rollback to step 2, the problem is found
    again with its onset at step 2, so the second rollback needs step 1's checkpoint. Pruning
    had deleted it (it kept the newest two and the newest healthy one, step 2), so the run
    stopped with no healthy checkpoint left."""
    run_dir = tmp_path / "run"
    custom = [
        {
            "path": f"{RULES}:in_turn",
            "action": "rollback",
            "params": {"firings": [[3, 3], [3, 2]], "count": str(tmp_path / "count")},
        }
    ]
    extra = [
        "explorer.group_size=2",
        "explorer.tasks_per_step=2",
        "run.steps=4",
        "run.checkpoint_every=1",
        "health.rollback.max_rollbacks=2",
        f"health.custom={json.dumps(custom)}",
    ]
    await train(toy_config(tiny_model_path, toy_tasks, run_dir, *extra), run_dir)
    events = [e for e in read_events(run_dir) if e.rule == "in_turn"]
    assert [(e.step, e.onset, e.rolled_back_to) for e in events] == [(3, 3, 2), (3, 2, 1)]
    assert json.loads((run_dir / "state.json").read_text())["step"] == 4
    assert [r.step for r in train_records(run_dir)] == [0, 1, 2, 3]


async def test_a_step_redone_after_a_kill_records_its_health_event_once(
    tiny_model_path, toy_tasks, tmp_path
):
    """Killed after step 1's warning but before step 1's checkpoint was committed: the resumed
    run redid step 1 and health.jsonl held its warning twice (two marks on the curves). And a
    streak that had not fired yet (truncation, patience 3: replies of 8 tokens from the tiny
    model all stop at the limit) lost its marks at the resume: step 0's policy, unhealthy
    before the kill, was a healthy checkpoint after it (a rollback could go back to it)."""
    from agentscope_rft.runtime.components import load_resumed_config, write_state

    run_dir = tmp_path / "run"
    custom = [{"path": f"{RULES}:always_at", "action": "warn", "params": {"step": 1, "onset": 1}}]
    extra = [
        "explorer.group_size=2",
        "explorer.tasks_per_step=2",
        "run.steps=2",
        "run.checkpoint_every=1",
        f"health.custom={json.dumps(custom)}",
        "health.rules.truncation.action=rollback",
        "health.rules.truncation.max_rate=0.01",
    ]
    await train(toy_config(tiny_model_path, toy_tasks, run_dir, *extra), run_dir)
    saved = json.loads((run_dir / "checkpoints/step-000001/run_state.json").read_text())
    assert saved["unhealthy_steps"] == [[0, 0]]
    write_state(run_dir, saved)
    # resumed with a bound step 1 does not break: step 0's mark stands (as in a run not killed)
    config = load_resumed_config(run_dir, ["health.rules.truncation.max_rate=1"])
    await train(config, run_dir, resume=True)
    events = [e for e in read_events(run_dir) if e.rule == "always_at"]
    assert [(e.step, e.action) for e in events] == [(1, "warn")]
    final = json.loads((run_dir / "checkpoints/step-000002/run_state.json").read_text())
    assert final["unhealthy_steps"] == [[0, 0]]


async def test_a_learning_rate_far_too_high_is_caught_as_a_dead_policy(
    tiny_model_path, toy_tasks, tmp_path
):
    """At trainer.lr 1e6 the tiny model is dead after one update: finite weights, entropy at its
    maximum (10.80, log of the vocabulary), grad_norm exactly 0 while the groups' rewards differ
    (measured). No rule caught it: the run trained on to the end."""
    run_dir = tmp_path / "run"
    small = ["explorer.group_size=4", "explorer.tasks_per_step=2", "run.steps=6"]
    config = toy_config(tiny_model_path, toy_tasks, run_dir, *small, "trainer.lr=1e6")
    with pytest.raises(RunStopped, match=r"health: dead_policy"):
        await train(config, run_dir)
    [event] = [e for e in read_events(run_dir) if e.rule == "dead_policy"]
    assert (event.action, event.onset, event.step) == ("stop", 1, 3)
    assert "trainer.lr" in event.message and "--fork-from" in event.message


async def test_the_last_checkpoint_after_a_rollback_is_on_the_path_the_run_kept(
    tiny_model_path, toy_tasks, tmp_path
):
    """A rollback from step 4 to 2, then a stop while redoing step 2 (saved after step 3):
    `runs/x:last` was the abandoned step-4 checkpoint, the policy the rule had found unhealthy."""
    from agentscope_rft.runtime.best import resolve_checkpoint

    run_dir = tmp_path / "run"
    rollback = {"path": f"{RULES}:once_at", "action": "rollback"}
    rollback["params"] = {"step": 4, "onset": 3, "flag": str(tmp_path / "f")}
    stop = {"path": f"{RULES}:on_visit", "action": "stop"}
    stop["params"] = {"step": 2, "visit": 2, "count": str(tmp_path / "visits")}
    extra = [
        "explorer.group_size=2",
        "explorer.tasks_per_step=2",
        "run.steps=6",
        "run.checkpoint_every=1",
        "run.keep_checkpoints=5",
        f"health.custom={json.dumps([rollback, stop])}",
    ]
    with pytest.raises(RunStopped, match="on_visit"):
        await train(toy_config(tiny_model_path, toy_tasks, run_dir, *extra), run_dir)
    assert json.loads((run_dir / "state.json").read_text())["step"] == 3
    assert resolve_checkpoint(f"{run_dir}:last").parent.name == "step-000003"
    assert not (run_dir / "checkpoints" / "step-000004").exists()
