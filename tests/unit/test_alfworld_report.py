"""The ALFWorld report: Wilson intervals, paired bootstrap differences, floors beside each arm."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from agentscope_rft.api import import_file

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "alfworld"


def _module(name: str) -> ModuleType:
    module: ModuleType = import_file(EXAMPLE / f"{name}.py")
    return module


report = _module("report")


def test_wilson_interval_matches_the_textbook_values() -> None:
    low, high = report.wilson(47, 100)
    assert (round(low, 4), round(high, 4)) == (0.3751, 0.5671)
    low, high = report.wilson(0, 120)  # no win still has an upper bound above 0
    assert low == 0.0 and round(high, 4) == 0.031
    low, high = report.wilson(120, 120)
    assert high == 1.0 and round(low, 3) == 0.969
    assert report.wilson(0, 0) == (0.0, 1.0)


def test_paired_bootstrap_brackets_the_difference_and_is_repeatable() -> None:
    first = [1.0] * 60 + [0.0] * 60
    second = [1.0] * 40 + [0.0] * 80
    diff, low, high = report.paired_bootstrap(first, second)
    assert round(diff, 4) == round(20 / 120, 4) and low < diff < high
    assert low > 0 and high < 0.35  # 20 games won only by the first: clearly above 0
    assert report.paired_bootstrap(first, second) == (diff, low, high)
    same = report.paired_bootstrap(first, first)
    assert same == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equally long"):
        report.paired_bootstrap([1.0], [])


def _tasks(n: int) -> list[dict]:
    rooms = ("kitchen", "bathroom")
    return [
        {"id": f"g{i}", "task_type": "pick_and_place_simple", "room": rooms[i % 2]}
        for i in range(n)
    ]


def _results(folder: Path, wins: list[float]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"task_id": f"g{i}", "success_rate": w, "rewards": [w]})
        for i, w in enumerate(wins)
    ]
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")


def _sweep(folder: Path, seeds: dict[str, list[float]]) -> Path:
    folder.mkdir(parents=True)
    runs = {seed: f"seed-{seed}" for seed in seeds}
    (folder / "sweep.json").write_text(json.dumps({"seeds": list(seeds), "runs": runs}))
    for seed, wins in seeds.items():
        _results(folder / f"seed-{seed}" / "test-best", wins)
    return folder


def test_report_puts_each_seed_beside_the_floors_and_compares_arms(tmp_path: Path) -> None:
    n = 100
    rl = _sweep(tmp_path / "rl", {"0": [1.0] * 60 + [0.0] * 40, "1": [1.0] * 50 + [0.0] * 50})
    control = _sweep(tmp_path / "control", {"0": [1.0] * 40 + [0.0] * 60, "1": [0.0] * n})
    floors = {
        "random": {f"g{i}": 0.0 for i in range(n)},
        "oracle": {f"g{i}": 1.0 for i in range(n)},
    }
    arms = {"rl": report.read_arm(rl), "control": report.read_arm(control)}
    markdown, data = report.report(_tasks(n), floors, arms)
    assert "| floor: random | 100 | 0.00 [0.00, 0.04] |" in markdown
    assert "| rl seed 0 | 100 | 0.60 [0.50, 0.69] |" in markdown
    assert "room: kitchen" in markdown and "Fewer than" not in markdown
    assert data["policies"]["rl seed 1"]["success"] == 0.5
    rows = {(d["seed"], d["games"]): d for d in data["differences"]}
    assert round(rows[("0", n)]["difference"], 4) == 0.2
    assert round(rows[("1", n)]["difference"], 4) == 0.5
    assert round(rows[("all", n)]["difference"], 4) == 0.35
    low, high = rows[("all", n)]["ci95"]
    assert low < 0.35 < high
    assert "rl: mean over 2 seeds 0.550 ± 0.071 (sample std)" in markdown


def test_a_single_run_arm_is_compared_with_every_seed_of_a_sweep(tmp_path: Path) -> None:
    n = 100
    rl = _sweep(tmp_path / "rl", {"0": [1.0] * 60 + [0.0] * 40, "1": [1.0] * 30 + [0.0] * 70})
    _results(tmp_path / "untrained", [1.0] * 10 + [0.0] * 90)
    arms = {"rl": report.read_arm(rl), "untrained": report.read_arm(tmp_path / "untrained")}
    markdown, data = report.report(_tasks(n), {}, arms)
    rows = {d["seed"]: round(d["difference"], 4) for d in data["differences"]}
    assert rows == {"0": 0.5, "1": 0.2, "all": 0.35}
    assert "no seed in common" not in markdown
    # The other way round too: the single run first.
    _, data = report.report(_tasks(n), {}, {"untrained": arms["untrained"], "rl": arms["rl"]})
    assert {d["seed"]: round(d["difference"], 4) for d in data["differences"]}["0"] == -0.5


def test_report_reads_explore_folders_and_refuses_foreign_games(tmp_path: Path) -> None:
    _results(tmp_path / "eval", [1.0, 0.0, 1.0])
    arm = report.read_arm(tmp_path / "eval")
    assert arm == {"-": {"g0": 1.0, "g1": 0.0, "g2": 1.0}}
    markdown, _ = report.report(_tasks(3), {}, {"step16": arm})
    assert "Fewer than 100 test games" in markdown and "| step16 | 3 | 0.67" in markdown
    with pytest.raises(SystemExit, match="not in the tasks file"):
        report.report(_tasks(2), {}, {"step16": arm})
    with pytest.raises(SystemExit, match=r"no sweep\.json, test-best/results\.jsonl or results"):
        report.read_arm(tmp_path / "missing")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.jsonl").write_text('{"task": 1}\n')
    with pytest.raises(SystemExit, match="not an explore result line"):
        report.read_arm(tmp_path / "broken")


def test_report_command_writes_markdown_and_json(tmp_path: Path) -> None:
    tasks = tmp_path / "test.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in _tasks(4)) + "\n")
    floors = tmp_path / "floors.json"
    floors.write_text(json.dumps({"policies": {"searcher": {"g0": True, "g1": False}}}))
    _results(tmp_path / "eval", [1.0, 1.0, 0.0, 0.0])
    out, numbers = tmp_path / "report.md", tmp_path / "report.json"
    report.main(
        [
            *("--arm", f"x={tmp_path / 'eval'}", "--tasks", str(tasks)),
            *("--floors", str(floors), "--out", str(out), "--json", str(numbers)),
        ]
    )
    assert "| floor: searcher | 2 | 0.50" in out.read_text()
    assert json.loads(numbers.read_text())["policies"]["x"]["success"] == 0.5
    with pytest.raises(SystemExit, match="write NAME=FOLDER"):
        report.main(["--arm", "runs/x", "--tasks", str(tasks), "--floors", str(floors)])
    with pytest.raises(SystemExit, match=r"floors\.py"):
        report.main(["--tasks", str(tasks), "--floors", str(tmp_path / "none.json")])


def test_plot_draws_a_run_folders_validation_and_sampled_curves(tmp_path: Path) -> None:
    plot = _module("plot_results")
    run = tmp_path / "seed-0"
    run.mkdir()
    records = [{"step": 0, "phase": "val", "success_rate": 0.0}]
    records += [{"step": s, "phase": "train", "success_rate": 0.25} for s in (16, 17, 18, 19)]
    records += [{"step": 16, "phase": "val", "success_rate": 0.4}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (run / "config.yaml").write_text("offline: {warmup_steps: 16}\n")
    (run / "best.json").write_text(json.dumps({"step": 16, "metric": "val/success_rate"}))
    _results(tmp_path / "test-16", [1.0, 0.0])
    plot.main(["--run", str(run), "--heldout", f"16={tmp_path / 'test-16'}"])
    assert (run / "success_curve.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="pass a run folder"):
        plot.main(["--run", str(tmp_path)])
