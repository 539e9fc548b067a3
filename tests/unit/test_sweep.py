"""Seed sweeps: `--seeds` parsing, the sweep folder's record, and the summary maths."""

import json
import math
import re
from pathlib import Path

import pytest

from agentscope_rft.config import load_config
from agentscope_rft.runtime.artefacts import INDEX, export_artefacts
from agentscope_rft.runtime.sweep import (
    SweepError,
    choose_parallel,
    is_sweep,
    open_sweep,
    parse_seeds,
    read_sweep,
    seed_command,
)
from agentscope_rft.runtime.sweep_summary import SEEDS_PLOT, spread, summarize


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("0,1,2", [0, 1, 2]), ("0-4", [0, 1, 2, 3, 4]), ("3", [3]), (" 5 , 0-1", [5, 0, 1])],
)
def test_seeds_parse(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a seed"),
        ("a,b", "'a' is not a seed"),
        ("1,,2", "'' is not a seed"),
        ("-1", "is not a seed"),
        ("4-2", "runs backwards; use 2-4"),
        ("0-2,1", r"seed\(s\) \[1\] given more than once"),
        ("0-5000", "more than 1000 seeds"),
    ],
)
def test_bad_seeds_are_refused_with_the_fix(text, message):
    with pytest.raises(SweepError, match=message):
        parse_seeds(text)


def test_bad_seeds_on_the_command_line_exit_2_naming_the_option(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from agentscope_rft.cli import app

    monkeypatch.chdir(tmp_path)  # in-process: a subprocess cost seconds of imports
    result = CliRunner().invoke(app, ["train", "--seeds", "2-0"], env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert "--seeds '2-0'" in result.output and "runs backwards" in result.output


def config(tmp_path: Path, *extra: str):
    base = [
        f"run.dir={tmp_path / 'sweep'}",
        "run.name=toy",
        "workflow=app:run",
        "tasks.train=t.jsonl",
    ]
    return load_config(None, [*base, *extra])


def test_a_sweep_follows_the_seed_except_where_the_config_sets_it(tmp_path):
    cfg = config(tmp_path, "explorer.seed=7")
    data = open_sweep(cfg, tmp_path / "sweep", [0, 3])
    assert data["follow"] == ["run.seed", "engine.seed"]
    assert data["runs"] == {"0": "seed-0", "3": "seed-3"}
    assert data["status"] == {"0": "pending", "3": "pending"}
    command = seed_command(tmp_path / "sweep", data, 3, "INFO")
    sets = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
    assert f"run.dir={tmp_path / 'sweep' / 'seed-3'}" in sets
    assert {"run.seed=3", "engine.seed=3", "run.name=toy-seed-3"} <= set(sets)
    assert not any(s.startswith("explorer.seed") for s in sets)
    # a seed with a checkpoint resumes from it
    (tmp_path / "sweep" / "seed-3").mkdir()
    (tmp_path / "sweep" / "seed-3" / "state.json").write_text('{"step": 1}')
    assert seed_command(tmp_path / "sweep", data, 3, "INFO")[-2:] == [
        "--resume",
        str(tmp_path / "sweep" / "seed-3"),
    ]


def test_an_existing_sweep_continues_with_its_config_and_refuses_another(tmp_path):
    open_sweep(config(tmp_path), tmp_path / "sweep", [0, 1])
    # the same config (another run.seed does not count) continues and adds new seeds
    again = open_sweep(config(tmp_path, "run.seed=5"), tmp_path / "sweep", [1, 2])
    assert again["seeds"] == [0, 1, 2] and again["status"]["2"] == "pending"
    with pytest.raises(SweepError, match=r"another config \(trainer.lr: 1e-06 -> 0.001\)"):
        open_sweep(config(tmp_path, "trainer.lr=1e-3"), tmp_path / "sweep", [0])
    replaced = open_sweep(
        config(tmp_path, "trainer.lr=1e-3", "run.overwrite=true"), tmp_path / "sweep", [4]
    )
    assert replaced["seeds"] == [4]
    assert read_sweep(tmp_path / "sweep")["config"]["trainer"]["lr"] == 1e-3


def test_a_run_folder_is_not_taken_for_a_sweep(tmp_path):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "state.json").write_text("{}")
    with pytest.raises(SweepError, match="is a run folder, not a sweep"):
        open_sweep(config(tmp_path), tmp_path / "sweep", [0])


def test_a_folder_holding_only_an_earlier_baseline_becomes_the_sweep(tmp_path):
    # The untrained model's test evaluation copied in to be reused (`--test` reuses it)
    baseline = tmp_path / "sweep" / "test-untrained"
    baseline.mkdir(parents=True)
    (baseline / "summary.json").write_text('{"reward/mean": 0.1}')
    data = open_sweep(config(tmp_path), tmp_path / "sweep", [0])
    assert data["seeds"] == [0] and is_sweep(tmp_path / "sweep")
    assert json.loads((baseline / "summary.json").read_text()) == {"reward/mean": 0.1}
    (tmp_path / "run" / "test-untrained").mkdir(parents=True)  # beside a run's files: refused
    (tmp_path / "run" / "state.json").write_text("{}")
    with pytest.raises(SweepError, match="is a run folder, not a sweep"):
        open_sweep(config(tmp_path), tmp_path / "run", [0])


def test_a_folder_holding_only_explore_results_becomes_the_sweep(tmp_path):
    """`explore --split test` of the config before `train --seeds` (the README's baseline) left
    `explore-test/` in the config's run folder, and the sweep refused it as a run folder, offering
    run.overwrite, which deletes the baseline."""
    sweep = tmp_path / "sweep"
    for name in ("explore-test", "explore-val-best"):
        (sweep / name).mkdir(parents=True)
        (sweep / name / "summary.json").write_text('{"reward/mean": 0.1}')
    data = open_sweep(config(tmp_path), sweep, [0])
    assert data["seeds"] == [0] and is_sweep(sweep)
    assert (sweep / "explore-test" / "summary.json").is_file()
    (tmp_path / "run" / "explore-test").mkdir(parents=True)  # beside a run's files: refused
    (tmp_path / "run" / "state.json").write_text("{}")
    with pytest.raises(SweepError, match="is a run folder, not a sweep"):
        open_sweep(config(tmp_path), tmp_path / "run", [0])


def test_parallel(tmp_path):
    assert choose_parallel(config(tmp_path), "auto", 5) == 1
    assert choose_parallel(config(tmp_path), "3", 2) == 2
    with pytest.raises(SweepError, match="--parallel 'many'"):
        choose_parallel(config(tmp_path), "many", 2)
    ray = config(tmp_path, "runtime.type=ray", "runtime.runners=2", "runtime.runner_cpus=0.5")
    # one run: 2 x 0.5 runner CPUs + 1 for its own process = 2 CPUs
    import os

    expected = max(1, min(4, (os.cpu_count() or 1) // 2))
    assert choose_parallel(ray, "auto", 4) == expected


def test_spread_is_the_sample_std():
    stats = spread([0.5, 0.6, 0.9, float("nan")])
    assert stats["n"] == 3
    assert stats["mean"] == pytest.approx(2.0 / 3)
    assert stats["std"] == pytest.approx(math.sqrt(0.0866667 / 2), rel=1e-5)
    assert spread([0.4]) == {"mean": 0.4, "std": None, "n": 1}


def write_run(folder: Path, lines: list[dict], step: int, best: dict | None = None) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "state.json").write_text(json.dumps({"step": step}))
    if best is not None:
        (folder / "best.json").write_text(json.dumps(best))


def val(step: int, value: float, phase: str = "val") -> dict:
    return {"step": step, "time": 1.0, "phase": phase, "reward/mean": value, "success_rate": 0.0}


def test_summary_of_fixture_seeds(tmp_path):
    sweep = tmp_path / "sweep"
    open_sweep(config(tmp_path), sweep, [0, 1, 2, 3])
    train = {"step": 0, "time": 1.0, "phase": "train", "reward/mean": 5.0}
    # seed 0: no best.json -> best val record (0.5 at step 2); last checkpoint step 4 -> 0.3
    write_run(sweep / "seed-0", [val(0, 0.1), train, val(2, 0.5), val(4, 0.3)], 4)
    # seed 1: an older run with phase eval only
    write_run(sweep / "seed-1", [val(s, v, "eval") for s, v in ((0, 0.2), (2, 0.4), (4, 0.6))], 4)
    # seed 2: best.json; its step-4 record was superseded by a resume
    lines = [val(0, 0.0), val(2, 0.9), val(4, 0.1), {"step": 4, "time": 1.0, "phase": "resume"}]
    best = {"step": 2, "metric": "val/reward/mean", "value": 0.9, "mode": "max"}
    write_run(sweep / "seed-2", [*lines, val(4, 0.6)], 4, best)
    data = read_sweep(sweep)
    data["status"] = {"0": "done", "1": "done", "2": "done", "3": "failed"}
    del data["config"]["tasks"]["val"]  # an older sweep: its config had no val, eval validated
    (sweep / "sweep.json").write_text(json.dumps(data))

    summary = summarize(sweep)
    seeds = summary["seeds"]
    assert [seeds[k]["best"] for k in "012"] == [
        {"step": 2, "value": 0.5},
        {"step": 4, "value": 0.6},
        {"step": 2, "value": 0.9},
    ]
    assert [seeds[k]["last"]["value"] for k in "012"] == [0.3, 0.6, 0.6]
    assert seeds["1"]["phase"] == "eval"
    assert seeds["2"]["best_model"].endswith("seed-2/checkpoints/best/model")
    assert seeds["0"]["best_model"].endswith("seed-0/checkpoints/step-000004/model")
    assert seeds["3"] == {"status": "failed", "run": "seed-3"}
    assert summary["best"]["n"] == 3 and summary["failed"] == [3]
    assert summary["best"]["mean"] == pytest.approx(0.666667, abs=1e-6)
    assert summary["best"]["std"] == pytest.approx(0.208167, abs=1e-6)
    assert summary["last"]["mean"] == pytest.approx(0.5)
    assert summary["last"]["std"] == pytest.approx(0.173205, abs=1e-6)
    table = (sweep / "summary.md").read_text()
    assert "| 2 | done | 2 | 0.9 | 4 | 0.6 |" in table
    assert "| 3 | failed |" in table
    assert "0.6667 ± 0.208 (n=3)" in table and "0.5 ± 0.173 (n=3)" in table
    assert json.loads((sweep / "summary.json").read_text())["best"]["n"] == 3
    assert (sweep / SEEDS_PLOT).stat().st_size > 10_000


def test_a_seed_that_ended_before_the_sweep_was_killed_is_summarized_as_done(tmp_path):
    sweep = tmp_path / "sweep"
    open_sweep(config(tmp_path, "run.steps=4"), sweep, [0, 1])
    write_run(sweep / "seed-0", [val(0, 0.1), val(4, 0.3)], 4)  # ended: its last step saved
    data = read_sweep(sweep)
    data["status"] = {"0": "running", "1": "pending"}  # the sweep died before marking it done
    (sweep / "sweep.json").write_text(json.dumps(data))

    summary = summarize(sweep)
    assert summary["seeds"]["0"]["status"] == "done"
    assert summary["seeds"]["0"]["last"] == {"step": 4, "value": 0.3}
    assert summary["best"]["n"] == 1 and summary["not_done"] == [1]
    assert "| 0 | done | 4 | 0.3 | 4 | 0.3 |" in (sweep / "summary.md").read_text()


def test_summary_by_the_mean_of_several_validation_metrics(tmp_path):
    sweep = tmp_path / "sweep"
    metric = "run.best_metric=[val/reward/by_type/a, val/reward/by_type/b]"
    open_sweep(config(tmp_path, metric), sweep, [0])

    def by_type(step: int, a: float, b: float, c: float) -> dict:
        types = {"reward/by_type/a": a, "reward/by_type/b": b, "reward/by_type/c": c}
        return {"step": step, "time": 1.0, "phase": "val", "reward/mean": c, **types}

    # type c (not counted) peaks at step 2; the counted mean peaks at step 4
    write_run(sweep / "seed-0", [by_type(2, 0.1, 0.1, 0.9), by_type(4, 0.5, 0.3, 0.1)], 4)
    data = read_sweep(sweep)
    data["status"] = {"0": "done"}
    (sweep / "sweep.json").write_text(json.dumps(data))
    summary = summarize(sweep)
    assert summary["metric"] == "mean(val/reward/by_type/a, val/reward/by_type/b)"
    assert summary["seeds"]["0"]["best"] == {"step": 4, "value": pytest.approx(0.4)}
    assert summary["seeds"]["0"]["curve"] == [[2, pytest.approx(0.1)], [4, pytest.approx(0.4)]]


def test_artefacts_export_refuses_what_it_would_damage(tmp_path):
    sweep = tmp_path / "sweep"
    open_sweep(config(tmp_path), sweep, [0])
    with pytest.raises(SweepError, match=r"no summary\.json yet"):
        export_artefacts(sweep, tmp_path / "out")
    write_run(sweep / "seed-0", [val(0, 0.1), val(2, 0.5)], 2)
    (sweep / "seed-0" / "checkpoints").mkdir()
    (sweep / "seed-0" / "rollouts.jsonl").write_text("x" * 100)
    data = read_sweep(sweep)
    data["status"] = {"0": "done"}
    (sweep / "sweep.json").write_text(json.dumps(data))
    summarize(sweep)
    with pytest.raises(SweepError, match="inside the sweep folder"):
        export_artefacts(sweep, sweep / "results")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SweepError, match="not an artefacts export"):
        export_artefacts(sweep, mine)
    assert (mine / "notes.txt").read_text() == "keep me"  # nothing of the user's is touched

    out = tmp_path / "out"
    export_artefacts(sweep, out, "agentscope-rft train --seeds 0")
    (out / "stale.txt").write_text("from an older export")
    written = export_artefacts(sweep, out, "agentscope-rft train --seeds 0")  # replaces it
    names = sorted(str(p.relative_to(out)) for p in written)
    assert names == sorted(
        [
            *("ARTEFACTS.md", "config.yaml", "sweep.json", "summary.json", "summary.md"),
            *("seeds.png", "seed-0/metrics.jsonl", "seed-0/state.json"),
        ]
    )
    assert not (out / "stale.txt").exists()
    assert "`agentscope-rft train --seeds 0`" in (out / INDEX).read_text()


def test_a_test_evaluation_newer_than_the_best_is_reused(tmp_path, monkeypatch):
    import os

    from agentscope_rft.runtime import sweep_summary

    run, model = tmp_path / "seed-0", tmp_path / "seed-0" / "checkpoints" / "best" / "model"
    model.mkdir(parents=True)
    (run / "best.json").write_text('{"step": 2}')
    (run / "test-best").mkdir()
    (run / "test-best" / "summary.json").write_text('{"reward/mean": 0.42}')
    explored: list[Path] = []
    monkeypatch.setattr(sweep_summary, "_evaluate", lambda c, o, out: explored.append(out) or {})
    assert sweep_summary.evaluate_best(run, str(model)) == {"reward/mean": 0.42}
    assert explored == []
    # a best chosen after the evaluation (the seed ran again): evaluated anew
    later = (run / "test-best" / "summary.json").stat().st_mtime + 10
    os.utime(run / "best.json", (later, later))
    assert sweep_summary.evaluate_best(run, str(model)) == {}
    assert explored == [run / "test-best"]


def test_artefacts_of_a_forked_sweep_name_the_fork_in_the_remake_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "runs" / "control"
    open_sweep(config(tmp_path), sweep, [0])
    write_run(sweep / "seed-0", [val(16, 0.1), val(20, 0.5)], 20)
    data = read_sweep(sweep)
    data["status"] = {"0": "done"}
    data["fork"] = {"from": str(tmp_path / "runs" / "rl"), "step": 16, "runs": {}}
    (sweep / "sweep.json").write_text(json.dumps(data))
    summarize(sweep)
    export_artefacts(sweep, tmp_path / "out")
    index = (tmp_path / "out" / INDEX).read_text()
    assert "--seeds 0 --set run.name=" in index
    assert "--fork-from runs/rl --fork-step 16`" in index


def test_a_sweep_continued_on_another_commit_records_each_seeds(tmp_path, monkeypatch):
    from agentscope_rft.runtime import sweep as sweep_module

    sweep = tmp_path / "runs" / "rl"
    monkeypatch.setattr(sweep_module, "git_commit", lambda: "a" * 40)
    open_sweep(config(tmp_path), sweep, [0])
    monkeypatch.setattr(sweep_module, "git_commit", lambda: "b" * 40)
    data = open_sweep(config(tmp_path), sweep, [0, 1])
    assert data["commits"] == {"0": "a" * 40, "1": "b" * 40}
    for seed in (0, 1):
        write_run(sweep / f"seed-{seed}", [val(4, 0.1 * seed)], 4)
    data["status"] = {"0": "done", "1": "done"}
    (sweep / "sweep.json").write_text(json.dumps(data))
    summarize(sweep)
    export_artefacts(sweep, tmp_path / "out")
    index = (tmp_path / "out" / INDEX).read_text()
    assert f"seed 0 `{'a' * 40}`, seed 1 `{'b' * 40}`" in index
    # a sweep written before per-seed commits: its seeds keep the sweep's one commit
    del data["commits"]
    (sweep / "sweep.json").write_text(json.dumps(data))
    assert open_sweep(config(tmp_path), sweep, [2])["commits"] == {
        "0": "a" * 40,
        "1": "a" * 40,
        "2": "b" * 40,
    }


def test_artefacts_exported_into_the_checkout_load_on_any_clone(tmp_path, monkeypatch):
    import shutil

    import yaml

    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "ex" / "data").mkdir(parents=True)
    (repo / "ex" / "app.py").write_text("async def run(task, model):\n    return 1.0\n")
    (repo / "ex" / "data" / "train.jsonl").write_text('{"id": "a", "question": "q"}\n')
    monkeypatch.chdir(repo)
    sweep = repo / "runs" / "toy"
    cfg = load_config(
        None,
        [
            f"run.dir={sweep}",
            "run.name=toy",
            f"workflow={repo / 'ex' / 'app.py'}:run",
            f"tasks.train={repo / 'ex' / 'data' / 'train.jsonl'}",
            "model.name_or_path=smollm2-135m-instruct",
        ],
    )
    open_sweep(cfg, sweep, [0])
    write_run(sweep / "seed-0", [val(0, 0.1), val(2, 0.5)], 2)
    (sweep / "seed-0" / "config.yaml").write_text((sweep / "config.yaml").read_text())
    data = read_sweep(sweep)
    data["status"] = {"0": "done"}
    (sweep / "sweep.json").write_text(json.dumps(data))
    summarize(sweep)

    out = repo / "ex" / "results"
    export_artefacts(sweep, out)
    top = yaml.safe_load((out / "config.yaml").read_text())
    assert top["workflow"] == "../app.py:run"
    assert top["tasks"]["train"] == "../data/train.jsonl"
    assert top["model"]["name_or_path"] == "smollm2-135m-instruct"  # a name, not a path
    seed = yaml.safe_load((out / "seed-0" / "config.yaml").read_text())
    assert seed["workflow"] == "../../app.py:run"
    assert "`agentscope-rft train --config ex/results/config.yaml --seeds 0" in (
        (out / INDEX).read_text()
    )
    # the exported config loads on another clone, finding that clone's files
    clone = tmp_path / "clone"
    shutil.copytree(repo, clone, ignore=shutil.ignore_patterns("runs"))
    moved = load_config(clone / "ex" / "results" / "config.yaml")
    assert moved.workflow == f"{clone / 'ex' / 'app.py'}:run"
    assert moved.tasks.train == str(clone / "ex" / "data" / "train.jsonl")

    # exported outside the checkout: the absolute paths are kept, not climbed out to
    export_artefacts(sweep, tmp_path / "elsewhere")
    kept = yaml.safe_load((tmp_path / "elsewhere" / "config.yaml").read_text())
    assert kept["workflow"] == f"{repo / 'ex' / 'app.py'}:run"
    assert "--config <the config>" in (tmp_path / "elsewhere" / INDEX).read_text()


def test_artefacts_of_a_sweep_in_a_fresh_clone_exported_into_the_checkout_load_there(
    tmp_path, monkeypatch
):
    """A table re-made on a fresh clone, exported into the working checkout: the configs kept
    the clone's absolute paths and ARTEFACTS.md said `--config <the config>` and forked from
    the clone's absolute folder, so the committed config loaded on no other machine."""
    import yaml

    clone, work = tmp_path / "clone", tmp_path / "work"
    for repo in (clone, work):
        (repo / ".git").mkdir(parents=True)
        (repo / "ex").mkdir()
        (repo / "ex" / "app.py").write_text("async def run(task, model):\n    return 1.0\n")
        (repo / "ex" / "t.jsonl").write_text('{"id": "a", "question": "q"}\n')
    monkeypatch.chdir(clone)
    sweep = clone / "runs" / "toy"
    files = [f"workflow={clone / 'ex' / 'app.py'}:run", f"tasks.train={clone / 'ex' / 't.jsonl'}"]
    open_sweep(load_config(None, [f"run.dir={sweep}", "run.name=toy", *files]), sweep, [0])
    write_run(sweep / "seed-0", [val(0, 0.1), val(2, 0.5)], 2)
    data = read_sweep(sweep)
    data["status"] = {"0": "done"}
    data["fork"] = {"from": str(clone / "runs" / "warm"), "step": 1, "runs": {}}
    (sweep / "sweep.json").write_text(json.dumps(data))
    summarize(sweep)

    out = work / "ex" / "results"
    export_artefacts(sweep, out)
    assert yaml.safe_load((out / "config.yaml").read_text())["workflow"] == "../app.py:run"
    loaded = load_config(out / "config.yaml")
    assert loaded.workflow == f"{work / 'ex' / 'app.py'}:run"
    assert loaded.tasks.train == str(work / "ex" / "t.jsonl")
    index = (out / INDEX).read_text()
    assert "train --config ex/results/config.yaml --seeds 0" in index
    assert "--fork-from runs/warm --fork-step 1`" in index and str(clone) not in index


def test_a_seed_without_validation_shows_dashes_not_none():
    from agentscope_rft.runtime.sweep_summary import markdown_table

    empty = {"mean": None, "std": None, "n": 0}
    result = {"status": "done", "best": {"step": None, "value": None}, "last": {"step": 2}}
    summary = {"metric": "val/reward/mean", "mode": "max", "seeds": {"0": result}}
    table = markdown_table({**summary, "best": empty, "last": empty, "test": {}}, "sw")
    assert "| 0 | done | – | – | 2 | – |" in table and "None" not in table


def test_a_seed_gone_or_without_the_metric_is_named_not_a_silent_dash(tmp_path, caplog):
    """A done seed whose folder was deleted showed `done` with dashes; one that logged other
    metrics showed dashes too; neither said why its n dropped."""
    sweep = tmp_path / "sweep"
    open_sweep(config(tmp_path), sweep, [0, 1, 2])
    write_run(sweep / "seed-0", [val(0, 0.1), val(2, 0.5)], 2)
    other = {"step": 2, "time": 1.0, "phase": "val", "score": 0.7}
    write_run(sweep / "seed-1", [other], 2)
    data = read_sweep(sweep)
    data["status"] = {"0": "done", "1": "done", "2": "done"}  # seed-2's folder is gone
    (sweep / "sweep.json").write_text(json.dumps(data))

    with caplog.at_level("WARNING"):
        summary = summarize(sweep)
    assert summary["seeds"]["2"] == {"status": "missing", "run": "seed-2"}
    assert summary["not_done"] == [2] and summary["best"]["n"] == 1
    assert "| 2 | missing |" in (sweep / "summary.md").read_text()
    assert f"seed 2: sweep.json says done, but {sweep / 'seed-2' / 'metrics.jsonl'} is gone" in (
        caplog.text
    )
    assert (
        f"seed 1: {sweep / 'seed-1' / 'metrics.jsonl'} logs no val/reward/mean (its val records "
        "log 1 metrics, e.g. score); the seed is left out of mean ± std"
    ) in caplog.text


def test_a_sweep_json_without_its_keys_is_one_error(tmp_path):
    """A hand-written or foreign sweep.json (`{}`) ended in a KeyError traceback."""
    (tmp_path / "sweep.json").write_text("{}")
    with pytest.raises(SweepError, match=r"sweep.json has no seeds, runs, status, config: it is"):
        summarize(tmp_path)


def test_without_a_validation_split_no_best_is_chosen_on_the_test_split(
    tmp_path, caplog, monkeypatch
):
    """A config with tasks.eval (test) and no tasks.val evaluates the test split during training
    for monitoring only; the summary took the best of those test records as the seed's `best val`
    and labelled the last checkpoint's test score `(best ckpt)`: a checkpoint chosen on test."""
    sweep = tmp_path / "sweep"
    open_sweep(config(tmp_path, "tasks.eval=test.jsonl"), sweep, [0, 1])
    evals = [val(s, v, "eval") for s, v in ((0, 0.2), (2, 0.9), (4, 0.4))]
    write_run(sweep / "seed-0", evals, 4)
    write_run(sweep / "seed-1", [val(s, v, "eval") for s, v in ((0, 0.2), (4, 0.6))], 4)
    for seed, score in ((0, 0.3), (1, 0.5)):
        (sweep / f"seed-{seed}" / "test-best").mkdir()
        (sweep / f"seed-{seed}" / "test-best" / "summary.json").write_text(
            json.dumps({"reward/mean": score})
        )
    data = read_sweep(sweep)
    data["status"] = {"0": "done", "1": "done"}
    (sweep / "sweep.json").write_text(json.dumps(data))

    from matplotlib.figure import Figure

    labels: list[str] = []
    savefig = Figure.savefig

    def record_labels(figure, *args, **kwargs):
        labels.extend([figure.axes[0].get_ylabel(), figure.axes[0].get_title()])
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record_labels)
    with caplog.at_level("WARNING"):
        summary = summarize(sweep)
    seed = summary["seeds"]["0"]
    assert seed["best"] == {"step": None, "value": None}  # not step 2's 0.9, a test score
    assert seed["last"] == {"step": 4, "value": 0.4}
    assert seed["checkpoint"] == "last"
    assert seed["best_model"].endswith("seed-0/checkpoints/step-000004/model")
    assert summary["best"]["n"] == 0 and summary["last"]["n"] == 2
    table = (sweep / "summary.md").read_text()
    assert "| 0 | done | – | – | 4 | 0.4 | 0.3 |" in table
    assert "test reward/mean (last ckpt)" in table and "(best ckpt)" not in table
    assert "no validation split (tasks.val)" in table
    # what is shown is named: the test split's in-training evaluation, not `val/`
    shown = "eval/reward/mean (test split)"
    assert f"| best {shown} | last step | last {shown} |" in table
    assert not re.search(r"\bval/", table)
    assert labels == [shown, f"{shown} by seed"]
    assert "tasks.val is not set: the in-training evaluation of seed(s) 0, 1 is of the test" in (
        caplog.text
    )
    assert "logs no val/reward/mean" not in caplog.text


def test_a_last_checkpoint_already_tested_is_reused(tmp_path, monkeypatch):
    """A seed without best.json (no validation) was evaluated on the test split anew by every
    `--test`, silently replacing the earlier look."""
    from agentscope_rft.runtime import sweep_summary

    run = tmp_path / "seed-0"
    step2, step4 = (run / "checkpoints" / f"step-00000{s}" / "model" for s in (2, 4))
    step2.mkdir(parents=True)
    (run / "test-best").mkdir()
    (run / "test-best" / "summary.json").write_text('{"reward/mean": 0.42}')
    (run / "test-best" / "config.yaml").write_text(f"model:\n  name_or_path: {step2}\n")
    explored: list[Path] = []
    monkeypatch.setattr(sweep_summary, "_evaluate", lambda c, o, out: explored.append(out) or {})
    assert sweep_summary.evaluate_best(run, str(step2)) == {"reward/mean": 0.42}
    assert explored == []
    # the seed ran on to step 4: its last checkpoint is another model, tested anew
    step4.mkdir(parents=True)
    assert sweep_summary.evaluate_best(run, str(step4)) == {}
    assert explored == [run / "test-best"]


def test_a_test_evaluation_replacing_an_earlier_one_is_called_a_second_look(tmp_path, caplog):
    """`explore --split test` (or a `--test` of another checkpoint) replaced an earlier test
    evaluation in its folder without a word."""
    from agentscope_rft.runtime.explore import warn_second_look

    out = tmp_path / "explore-test-best"
    out.mkdir()
    with caplog.at_level("WARNING"):
        warn_second_look(out, "test", "m2")  # a first look
        (out / "summary.json").write_text("{}")
        (out / "config.yaml").write_text("model:\n  name_or_path: m1\n")
        warn_second_look(out, "val", "m2")  # validation may be looked at again
        assert caplog.text == ""
        warn_second_look(out, "test", "m2")
    assert "holds a test-split evaluation already (of m1); this one, of m2, replaces it" in (
        caplog.text
    )
    assert "a second look at the test split" in caplog.text


def test_test_without_a_test_split_is_refused_before_any_seed_trains(tmp_path, monkeypatch):
    """`train --seeds 0,1,2 --test` with no tasks.test trained every seed, then failed at the
    summary: `--test: tasks.eval is not set`."""
    from agentscope_rft.runtime import sweep

    monkeypatch.setattr(sweep.SweepRun, "run", lambda self: pytest.fail("a seed was started"))
    with pytest.raises(SweepError, match=r"--test: the config has no test split \(tasks.test\)"):
        sweep.run_sweep(config(tmp_path), tmp_path / "sweep", [0, 1], test=True)
    assert not (tmp_path / "sweep").exists()


def test_an_untrained_baseline_of_another_model_is_refused_not_shown_as_the_floor(tmp_path):
    """A `test-untrained/` copied in from a sweep of another model was shown as this sweep's
    untrained row."""
    from agentscope_rft.runtime.sweep_summary import evaluate_untrained

    sweep = tmp_path / "sweep"
    open_sweep(config(tmp_path, "model.name_or_path=my-model"), sweep, [0])
    baseline = sweep / "test-untrained"
    baseline.mkdir()
    (baseline / "summary.json").write_text('{"reward/mean": 0.1}')
    (baseline / "config.yaml").write_text("model:\n  name_or_path: my-model\n")
    assert evaluate_untrained(sweep) == {"reward/mean": 0.1}
    (baseline / "config.yaml").write_text("model:\n  name_or_path: other-model\n")
    with pytest.raises(SweepError, match=r"is of other-model, not of this sweep's my-model"):
        evaluate_untrained(sweep)


def test_a_summary_on_a_full_disk_is_a_sweep_error_and_keeps_each_file_whole(tmp_path, monkeypatch):
    """A full disk while writing summary.md cut the committed table to nothing (a traceback)."""
    import errno

    sweep = tmp_path / "sweep"
    open_sweep(config(tmp_path), sweep, [0])
    write_run(sweep / "seed-0", [val(0, 0.1), val(2, 0.5)], 2)
    data = read_sweep(sweep)
    data["status"] = {"0": "done"}
    (sweep / "sweep.json").write_text(json.dumps(data))
    summarize(sweep)
    before = {p.name: p.read_bytes() for p in sweep.iterdir() if p.is_file()}
    write_text = Path.write_text

    def until_full(path: Path, text: str, *args, **kwargs) -> int:
        if path.name.startswith("summary.md"):
            write_text(path, text[:10], *args, **kwargs)  # what fitted
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", until_full)
    with pytest.raises(SweepError, match=rf"cannot write the summary into {sweep}: No space left"):
        summarize(sweep)
    monkeypatch.undo()
    after = {p.name: p.read_bytes() for p in sweep.iterdir() if p.is_file()}
    assert after == before  # summary.json again the same; summary.md the one before; no .tmp
