"""The validation split's slice, the best checkpoint and checkpoint names."""

import json
from pathlib import Path

import pytest

from agentscope_rft.explorer.tasks import TaskSetError, load_tasks, stratified_slice
from agentscope_rft.runtime.best import (
    RUN_STATE_FILE,
    BestCheckpoint,
    CheckpointNotFoundError,
    criterion_value,
    read_best,
    resolve_checkpoint,
)
from agentscope_rft.runtime.components import prune_checkpoints


def kinds(counts: dict[str, int]) -> list:
    rows = [{"id": f"{k}{i}", "kind": k} for k, n in counts.items() for i in range(n)]
    return load_tasks(rows)


def test_a_stratified_slice_keeps_each_types_share():
    tasks = kinds({"single": 30, "multi": 15, "compare": 5})
    picked = stratified_slice(tasks, 10, "kind")
    assert [t.data["kind"] for t in picked].count("single") == 6
    assert [t.data["kind"] for t in picked].count("multi") == 3
    assert [t.data["kind"] for t in picked].count("compare") == 1
    # a rare type keeps one task while the limit allows; file order is kept
    picked = stratified_slice(kinds({"a": 40, "b": 1}), 5, "kind")
    assert [t.data["kind"] for t in picked] == ["a", "a", "a", "a", "b"]
    assert [t.id for t in stratified_slice(tasks, 5, None)] == [
        "single0",
        "single10",
        "single20",
        "multi0",
        "multi10",
    ]
    assert stratified_slice(tasks, None, "kind") == tasks
    with pytest.raises(TaskSetError, match="has no such field"):
        stratified_slice(tasks, 3, "type")


def export_to(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")


def save_step(run: Path, step: int) -> Path:
    """A step checkpoint as the run writes it: the model, then its run state last."""
    folder = run / "checkpoints" / f"step-{step:06d}"
    export_to(folder / "model")
    (folder / RUN_STATE_FILE).write_text(json.dumps({"step": step}))
    return folder


def test_the_best_checkpoint_follows_the_metric_and_survives_pruning(tmp_path):
    best = BestCheckpoint(tmp_path, "val/success_rate", "max")
    assert best.consider(0, {"success_rate": 0.2}, export_to)
    assert not best.consider(4, {"success_rate": 0.1}, export_to)
    assert not best.consider(5, {"reward/mean": 0.9}, export_to)  # metric not logged
    assert best.consider(8, {"success_rate": 0.5}, export_to)
    assert read_best(tmp_path) == {
        "step": 8,
        "metric": "val/success_rate",
        "value": 0.5,
        "mode": "max",
    }
    assert json.loads((tmp_path / "checkpoints" / "best" / "best.json").read_text())["step"] == 8
    for step in (2, 4, 6):
        save_step(tmp_path, step)
    prune_checkpoints(tmp_path, keep=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best", "step-000006"]
    # lower is better
    low = BestCheckpoint(tmp_path / "low", "val/loss", "min")
    assert low.consider(1, {"loss": 2.0}, export_to) and low.consider(2, {"loss": 1.0}, export_to)
    assert not low.consider(3, {"loss": float("nan")}, export_to)


def test_checkpoint_names_resolve_to_model_folders(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4):
        save_step(run, step)
    with pytest.raises(CheckpointNotFoundError, match="has no best checkpoint"):
        resolve_checkpoint(f"{run}:best")
    assert resolve_checkpoint(run) == run / "checkpoints" / "step-000004" / "model"
    assert resolve_checkpoint("last", run) == run / "checkpoints" / "step-000004" / "model"
    BestCheckpoint(run, "val/reward/mean", "max").consider(2, {"reward/mean": 1.0}, export_to)
    assert resolve_checkpoint("best", run) == run / "checkpoints" / "best" / "model"
    assert resolve_checkpoint(run) == run / "checkpoints" / "best" / "model"
    assert resolve_checkpoint(f"{run}:last") == run / "checkpoints" / "step-000004" / "model"
    step = run / "checkpoints" / "step-000002"
    assert resolve_checkpoint(step) == step / "model"
    assert resolve_checkpoint(step / "model") == step / "model"
    with pytest.raises(CheckpointNotFoundError, match="nothing does not exist"):
        resolve_checkpoint(tmp_path / "nothing")


def test_a_checkpoint_is_named_by_its_step_or_latest(tmp_path):
    """`runs/x:latest` and `runs/x:12` said `runs/x:12 is not a run folder`; a missing run folder
    was `not a run folder` too."""
    run = tmp_path / "run"
    for step in (2, 4):
        save_step(run, step)
    assert resolve_checkpoint(f"{run}:2") == run / "checkpoints" / "step-000002" / "model"
    assert resolve_checkpoint("4", run) == run / "checkpoints" / "step-000004" / "model"
    assert resolve_checkpoint(f"{run}:latest") == run / "checkpoints" / "step-000004" / "model"
    with pytest.raises(CheckpointNotFoundError) as missing:
        resolve_checkpoint(f"{run}:3")
    assert str(missing.value) == (
        f"{run} has no checkpoint of step 3 (it keeps steps 2, 4; run.checkpoint_every and "
        "run.keep_checkpoints decide which)"
    )
    with pytest.raises(CheckpointNotFoundError, match=r"unknown checkpoint 'newest'; use"):
        resolve_checkpoint(f"{run}:newest")
    with pytest.raises(CheckpointNotFoundError, match=r"^\S*gone does not exist$"):
        resolve_checkpoint(f"{tmp_path / 'gone'}:best")


def test_last_skips_a_step_folder_whose_writing_was_cut_off(tmp_path):
    run = tmp_path / "run"
    save_step(run, 2)
    # killed while step 3 was written: its model's config is there, its weights and run state not
    export_to(run / "checkpoints" / "step-000003" / "model")
    assert resolve_checkpoint(f"{run}:last") == run / "checkpoints" / "step-000002" / "model"
    assert resolve_checkpoint(run) == run / "checkpoints" / "step-000002" / "model"
    (run / "checkpoints" / "step-000002" / RUN_STATE_FILE).unlink()
    with pytest.raises(CheckpointNotFoundError, match="has no saved checkpoint yet"):
        resolve_checkpoint("last", run)


def test_a_sweep_or_a_run_without_checkpoints_is_named_as_such(tmp_path):
    sweep = tmp_path / "sweep"
    save_step(sweep / "seed-1", 2)
    (sweep / "sweep.json").write_text("{}")
    (sweep / "seed-1" / "config.yaml").write_text("{}")
    with pytest.raises(CheckpointNotFoundError, match=r"is a seed sweep: .*seed-1:last"):
        resolve_checkpoint(f"{sweep}:last")
    killed = tmp_path / "killed"  # stopped before its first checkpoint
    killed.mkdir()
    (killed / "config.yaml").write_text("{}")
    with pytest.raises(CheckpointNotFoundError, match="killed has no saved checkpoint yet"):
        resolve_checkpoint(killed)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="is not a run folder"):
        resolve_checkpoint(tmp_path / "elsewhere")


def test_pruning_keeps_the_committed_checkpoint_over_one_cut_off_by_a_kill(tmp_path):
    for step in (4, 6):
        save_step(tmp_path, step)
    # a kill cut off the writing of steps 5 and 8; the resumed run then saved and committed 7
    for step in (5, 8):
        export_to(tmp_path / "checkpoints" / f"step-{step:06d}" / "model")
    save_step(tmp_path, 7)
    prune_checkpoints(tmp_path, keep=1)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-000007", "step-000008"]  # 8 is written again when step 8 is


def test_the_best_checkpoint_by_the_mean_of_several_metrics(tmp_path, caplog):
    counted = ["val/reward/by_type/single_hop", "val/reward/by_type/two_hop"]
    best = BestCheckpoint(tmp_path, counted, "max")
    by_type = {"reward/by_type/single_hop": 0.4, "reward/by_type/two_hop": 0.2}
    # a trivial stratum that rises does not move the criterion
    assert best.consider(0, {**by_type, "reward/by_type/comparison": 0.1}, export_to)
    assert not best.consider(2, {**by_type, "reward/by_type/comparison": 0.9}, export_to)
    assert best.consider(
        4, {"reward/by_type/single_hop": 0.6, "reward/by_type/two_hop": 0.1}, export_to
    )
    record = read_best(tmp_path)
    assert record is not None and record["step"] == 4
    assert record["value"] == pytest.approx(0.35)
    assert record["metric"] == f"mean({', '.join(counted)})"
    # one of them missing: no best, and the log names it
    assert not best.consider(6, {"reward/by_type/single_hop": 1.0}, export_to)
    assert "did not log reward/by_type/two_hop" in caplog.text
    # a resumed run with the same criterion keeps the best it had
    resumed = BestCheckpoint(tmp_path, counted, "max")
    assert resumed.record == record
    assert not resumed.consider(8, {**by_type, "reward/by_type/two_hop": 0.25}, export_to)


@pytest.mark.parametrize("metric", [[], ["val/reward/mean", "reward/mean"], "loss"])
def test_best_metric_must_name_validation_metrics(metric):
    from agentscope_rft.config import RunConfig

    fine = {"workflow": "app.py:run", "tasks": {"train": "t.jsonl"}}
    RunConfig.model_validate({**fine, "run": {"best_metric": ["val/a", "val/b"]}})
    with pytest.raises(ValueError, match="must be a validation metric"):
        RunConfig.model_validate({**fine, "run": {"best_metric": metric}})


def test_a_validation_whose_episodes_all_failed_is_never_the_best(tmp_path, caplog):
    # Failed episodes have no reward: the means over none are logged as 0, which a `min`
    # criterion (or a `max` one with nothing better yet) would take for a score.
    low = BestCheckpoint(tmp_path, "val/response_length/mean", "min")
    measured = {"response_length/mean": 30.0, "explore/rollouts": 4.0, "explore/failed": 1.0}
    assert low.consider(0, measured, export_to)
    broken = {"response_length/mean": 0.0, "explore/rollouts": 4.0, "explore/failed": 3.0}
    assert not low.consider(2, {**broken, "explore/timeout": 1.0}, export_to)
    assert "every episode failed" in caplog.text
    assert read_best(tmp_path)["step"] == 0
    first = BestCheckpoint(tmp_path / "first", "val/reward/mean", "max")
    assert not first.consider(0, {"reward/mean": 0.0, **broken, "explore/failed": 4.0}, export_to)
    assert read_best(tmp_path / "first") is None
    # fork and sweep-summary read the curve through the same criterion
    assert (
        criterion_value({"reward/mean": 0.0, **broken, "explore/failed": 4.0}, ["reward/mean"])
        is None
    )


def test_a_best_metric_validation_never_logs_is_refused_before_the_run(tmp_path):
    from agentscope_rft.config import ConfigError, load_config
    from agentscope_rft.runtime.best import best_metric_problem
    from agentscope_rft.runtime.preflight import preflight

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "type": "ab"[i % 2]}) + "\n" for i in range(4))
    )
    base = [
        "workflow=tests/integration/toy_app.py:run",
        f"tasks.train={tasks}",
        f"tasks.val={tasks}",
        "run.eval_every=2",
        "model.name_or_path=/no/model/needed/before/this",
    ]
    typo = load_config(None, [*base, "run.best_metric=val/sucess_rate"])
    with pytest.raises(ConfigError, match=r"val/sucess_rate.*did you mean val/success_rate\?"):
        preflight(typo)
    unstratified = load_config(None, [*base, "run.best_metric=val/reward/by_type/a"])
    with pytest.raises(ConfigError, match=r"only with tasks.stratify_field: type"):
        preflight(unstratified)
    no_such_type = [*base, "tasks.stratify_field=type", "run.best_metric=val/reward/by_type/c"]
    with pytest.raises(ConfigError, match=r"no validation task has type 'c'.*has: a, b"):
        preflight(load_config(None, no_such_type))
    # what validation logs, strata of the slice and the app's own metrics pass
    for fine in (
        "val/success_rate",
        ["val/reward/by_type/a", "val/reward/by_type/b"],
        "val/workflow/searches",
        "val/response_length/mean",
    ):
        assert best_metric_problem(fine, "type", [{"type": "a"}, {"type": "b"}]) is None


def test_a_rollback_drops_a_best_of_abandoned_steps_for_the_best_kept(tmp_path):
    best = BestCheckpoint(tmp_path, "val/loss", "min")
    for step, loss in ((0, 3.0), (2, 2.0), (4, 1.0)):
        assert best.consider(step, {"loss": loss}, export_to)
    kept = tmp_path / "kept-step-2"
    export_to(kept)
    # back to step 3: step 4's policy is gone; step 2 is the best kept one at hand
    best.rewind(3, [(0, 3.0), (2, 2.0)], {2: kept}.get)
    assert read_best(tmp_path) == {"step": 2, "metric": "val/loss", "value": 2.0, "mode": "min"}
    assert (tmp_path / "checkpoints" / "best" / "model" / "config.json").is_file()
    best.rewind(2, [(0, 3.0), (2, 2.0)], {}.get)  # not abandoned: kept as it is
    assert read_best(tmp_path)["step"] == 2
    best.rewind(1, [(0, 3.0)], {}.get)  # no kept policy at hand: no best until the next
    assert read_best(tmp_path) is None and not (tmp_path / "checkpoints" / "best").exists()
    assert best.consider(2, {"loss": 5.0}, export_to)


def test_a_resume_that_flips_best_mode_starts_the_best_anew(tmp_path, caplog):
    high = BestCheckpoint(tmp_path, "val/reward/mean", "max")
    assert high.consider(0, {"reward/mean": 0.9}, export_to)
    low = BestCheckpoint(tmp_path, "val/reward/mean", "min")  # resumed with best_mode: min
    assert low.record is None and "starting the best anew" in caplog.text
    assert low.consider(2, {"reward/mean": 0.5}, export_to)
    assert read_best(tmp_path)["mode"] == "min"


def test_the_test_slice_is_spread_over_a_file_ordered_by_dataset(tmp_path, tiny_model_path):
    # Search-R1's test file is NQ's 3,610 questions, then TriviaQA's, ...: its first 512 were
    # NQ alone, so the in-run test curve measured one dataset of seven.
    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.preflight import preflight

    rows = [{"id": f"{s}{i}", "data_source": s} for s in ("nq", "hotpotqa") for i in range(6)]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = load_config(
        None,
        [
            "workflow=tests/integration/toy_app.py:run",
            f"tasks.train={tasks}",
            f"tasks.eval={tasks}",
            "tasks.eval_limit=4",
            f"model.name_or_path={tiny_model_path}",
        ],
    )
    assert [t.id for t in preflight(config).eval_tasks] == ["nq0", "nq3", "hotpotqa0", "hotpotqa3"]


def test_a_best_checkpoint_cut_off_by_a_full_disk_leaves_the_old_best_and_no_half_copy(tmp_path):
    import errno

    best = BestCheckpoint(tmp_path, "val/success_rate", "max")
    assert best.consider(0, {"success_rate": 0.2}, export_to)

    def export_until_full(folder: Path) -> None:
        export_to(folder)
        (folder / "model.safetensors").write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        best.consider(4, {"success_rate": 0.9}, export_until_full)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best"]
    assert read_best(tmp_path)["step"] == 0
    assert json.loads((tmp_path / "checkpoints" / "best" / "best.json").read_text())["step"] == 0
