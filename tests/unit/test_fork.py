"""Forking a run at a checkpoint (`runtime.fork`): what the fork keeps, and the refusals."""

import json
import sqlite3
from pathlib import Path

import pytest

from agentscope_rft.config import dump_config, load_config
from agentscope_rft.monitor.records import (
    RESUME_PHASE,
    MetricRecord,
    before_resume,
    surviving_history,
)
from agentscope_rft.runtime.fork import FORK_FILE, ForkError, fork_run
from agentscope_rft.runtime.sweep import SweepError, open_sweep, seed_command


def config(run_dir: Path, *extra: str):
    base = [f"run.dir={run_dir}", "run.name=src", "workflow=app:run", "tasks.train=t.jsonl"]
    return load_config(None, [*base, "run.steps=8", "run.eval_every=2", *extra])


def jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def checkpoint(run: Path, step: int, value: float) -> None:
    folder = run / "checkpoints" / f"step-{step:06d}"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "weights").write_text(f"policy after {step}")
    (folder / "trainer.pt").write_text(f"optimizer after {step}")
    (folder / "run_state.json").write_text(json.dumps({"step": step, "sampler": {"at": value}}))


@pytest.fixture
def source(tmp_path) -> Path:
    """A run of 8 steps, validated every 2, checkpoints at 4, 6 and 8, best at step 6, one
    resume (at step 3) on the way, a SQLite buffer in its folder."""
    run = tmp_path / "src"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(config(run)))
    metrics: list[dict] = [{"step": 0, "phase": "val", "reward/mean": 0.1}]
    for step in range(5):  # the crashed attempt's steps 3 and 4 are superseded below
        metrics.append({"step": step, "phase": "train", "reward/mean": -1.0})
    metrics.append({"step": 3, "phase": RESUME_PHASE})
    for step in range(3, 8):
        metrics.append({"step": step, "phase": "train", "reward/mean": step / 10})
        if (step + 1) % 2 == 0:
            value = {2: 0.3, 4: 0.5, 6: 0.8, 8: 0.6}[step + 1]
            metrics.append({"step": step + 1, "phase": "val", "reward/mean": value})
    metrics.insert(3, {"step": 2, "phase": "val", "reward/mean": 0.3})
    jsonl(run / "metrics.jsonl", metrics)
    jsonl(
        run / "rollouts.jsonl",
        [{"step": s, "phase": p, "task_id": f"{p}{s}"} for s in range(9) for p in ("train", "val")],
    )
    (run / "rollouts.jsonl").open("a").write('{"step": 9, "pha')  # torn by a kill
    jsonl(run / "samples.jsonl", [{"step": s, "phase": "train", "ids": [s]} for s in range(8)])
    event = {"time": 0.0, "rule": "kl", "action": "warn", "metric": "kl/mean", "value": 1.0}
    event |= {"threshold": 0.5, "message": "drifted", "rolled_back_to": None}
    jsonl(run / "health.jsonl", [{**event, "step": s, "onset": s} for s in (2, 7)])
    for step in (4, 6, 8):
        checkpoint(run, step, step)
    best = run / "checkpoints" / "best"
    (best / "model").mkdir(parents=True)
    (best / "model" / "weights").write_text("policy after 6")
    record = {"step": 6, "metric": "val/reward/mean", "value": 0.8, "mode": "max"}
    (run / "best.json").write_text(json.dumps(record))
    (run / "tensorboard").mkdir()
    db = sqlite3.connect(run / "buffer.db")
    db.execute("create table groups (id integer)")
    db.execute("insert into groups values (7)")
    db.commit()
    db.close()
    return run


def test_a_fork_is_the_run_as_it_was_after_the_step(source, tmp_path):
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    dest = tmp_path / "fork"
    record = fork_run(source, 6, dest, config(dest, "trainer.lr=3e-6", "run.name=fork"))

    assert json.loads((dest / "state.json").read_text()) == {"step": 6, "sampler": {"at": 6}}
    assert sorted(p.name for p in (dest / "checkpoints").iterdir()) == ["best", "step-000006"]
    assert (dest / "checkpoints/step-000006/trainer.pt").read_text() == "optimizer after 6"
    # train steps before 6 (the surviving branch), validations up to 6
    kept = [(r["step"], r["phase"], r["reward/mean"]) for r in rows(dest / "metrics.jsonl")]
    assert kept == [
        (0, "val", 0.1), (0, "train", -1.0), (1, "train", -1.0), (2, "val", 0.3),
        (2, "train", -1.0), (3, "train", 0.3), (4, "val", 0.5), (4, "train", 0.4),
        (5, "train", 0.5), (6, "val", 0.8),
    ]  # fmt: skip
    logged = rows(dest / "rollouts.jsonl")
    assert [(r["step"], r["phase"]) for r in logged][-3:] == [(5, "train"), (5, "val"), (6, "val")]
    assert [r["step"] for r in rows(dest / "samples.jsonl")] == [0, 1, 2, 3, 4, 5]
    assert [r["step"] for r in rows(dest / "health.jsonl")] == [2]  # (it had none)
    # the source's best (step 6) is the fork's
    assert json.loads((dest / "best.json").read_text())["step"] == 6
    assert (dest / "checkpoints/best/model/weights").read_text() == "policy after 6"
    assert sqlite3.connect(dest / "buffer.db").execute("select id from groups").fetchall() == [(7,)]
    assert not (dest / "tensorboard").exists()
    assert record["differences"] == ["trainer.lr: 1e-06 -> 3e-06"]
    assert json.loads((dest / FORK_FILE).read_text())["step"] == 6
    assert "trainer:\n  lr: 3.0e-06" in (dest / "config.yaml").read_text()
    # the source is untouched
    assert before == {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}


def test_a_fork_before_the_best_step_takes_the_best_so_far_from_its_checkpoint(source, tmp_path):
    dest = tmp_path / "fork"
    record = fork_run(source, 4, dest, config(dest))
    assert record["best"] == {"step": 4, "metric": "val/reward/mean", "value": 0.5, "mode": "max"}
    assert (dest / "checkpoints/best/model/weights").read_text() == "policy after 4"
    assert record["differences"] == []


def test_a_best_whose_checkpoint_is_gone_is_not_kept(source, tmp_path):
    dest = tmp_path / "fork"
    (source / "best.json").unlink()  # best at step 4 by the metrics; step 4's folder pruned
    record = fork_run(source, 6, dest, config(dest, "run.best_mode=min"))
    assert record["best"] is None and not (dest / "best.json").exists()


@pytest.mark.parametrize(
    ("step", "extra", "message"),
    [
        (5, (), r"has no checkpoint of step 5 \(it has 4, 6, 8\); fork at one of those"),
        (6, ("run.steps=6",), "trains 6 steps, so nothing would be left after step 6"),
        (6, ("buffer.type=sql", "buffer.url=sqlite:///x.db"), "would be shared with the source"),
    ],
)
def test_a_fork_that_cannot_be_made_says_why(source, tmp_path, step, extra, message):
    with pytest.raises(ForkError, match=message):
        fork_run(source, step, tmp_path / "fork", config(tmp_path / "fork", *extra))
    assert not (tmp_path / "fork").exists()


def test_a_fork_never_replaces_a_folder_unasked(source, tmp_path):
    (tmp_path / "fork").mkdir()
    (tmp_path / "fork" / "keep").write_text("x")
    with pytest.raises(ForkError, match="already exists: it has no checkpoint to resume from"):
        fork_run(source, 6, tmp_path / "fork", config(tmp_path / "fork"))
    (tmp_path / "fork" / "state.json").write_text('{"step": 2}')
    with pytest.raises(ForkError, match=r"already exists: continue it with .*--resume"):
        fork_run(source, 6, tmp_path / "fork", config(tmp_path / "fork"))
    assert (tmp_path / "fork" / "keep").is_file()
    with pytest.raises(ForkError, match="is its source"):
        fork_run(source, 6, source, config(source))
    with pytest.raises(ForkError, match="not a run folder with checkpoints"):
        fork_run(tmp_path / "fork", 6, tmp_path / "other", config(tmp_path / "other"))
    fork_run(source, 6, tmp_path / "fork", config(tmp_path / "fork", "run.overwrite=true"))
    assert not (tmp_path / "fork" / "keep").exists()


def test_a_fork_killed_while_it_was_made_is_made_again_by_the_same_command(
    source, tmp_path, monkeypatch
):
    """Killed while copying (here: the buffer), the fork's folder had a checkpoint but no
    state.json; the same command was refused with advice to `--resume` it, which had nothing to
    resume from."""
    import agentscope_rft.runtime.fork as fork

    def killed(*_: object) -> None:
        raise KeyboardInterrupt  # the process ends here, as a kill -9 would end it

    dest = tmp_path / "fork"
    with monkeypatch.context() as patch:
        patch.setattr(fork, "_copy_sqlite", killed)
        with pytest.raises(KeyboardInterrupt):
            fork_run(source, 6, dest, config(dest))
    assert (dest / "checkpoints" / "step-000006").is_dir() and not (dest / "state.json").exists()
    fork_run(source, 6, dest, config(dest))
    assert json.loads((dest / "state.json").read_text())["step"] == 6
    made = {"best.json", "buffer.db", "checkpoints", "config.yaml", "fork.json", "state.json"}
    made |= {"metrics.jsonl", "rollouts.jsonl", "samples.jsonl", "health.jsonl"}
    assert {p.name for p in dest.iterdir()} == made  # no leftover of the cut-off attempt


def test_a_resume_keeps_the_validation_of_the_checkpoint_it_resumes_from():
    log = [MetricRecord(s, "train", None) for s in range(4)]
    log.insert(2, MetricRecord(2, "val", None))
    log += [MetricRecord(4, "val", None), MetricRecord(2, RESUME_PHASE, None)]
    kept = [(r.step, r.phase) for r in surviving_history(log)]
    assert kept == [(0, "train"), (1, "train"), (2, "val")]
    assert before_resume(log[:3], 0) == []


def test_a_sweep_forks_each_seed_from_the_same_seed(tmp_path):
    src = tmp_path / "src"
    open_sweep(config(src), src, [0, 1])
    dest = tmp_path / "arm"
    data = open_sweep(config(dest, "run.name=arm"), dest, [1], fork=(src, 4))
    assert data["fork"] == {
        "from": str(src.resolve()),
        "step": 4,
        "runs": {"1": str((src / "seed-1").resolve())},
    }
    command = seed_command(dest, data, 1, "INFO")
    at = command.index("--fork-from")
    assert command[at : at + 4] == [
        "--fork-from",
        str((src / "seed-1").resolve()),
        "--fork-step",
        "4",
    ]
    # continuing keeps the fork (without repeating it), adds new seeds' sources, refuses another
    again = open_sweep(config(dest, "run.name=arm"), dest, [0])
    assert sorted(again["fork"]["runs"]) == ["1"]
    again = open_sweep(config(dest, "run.name=arm"), dest, [0], fork=(src, 4))
    assert sorted(again["fork"]["runs"]) == ["0", "1"]
    with pytest.raises(SweepError, match=r"was started with .* at step 4, not --fork-from"):
        open_sweep(config(dest, "run.name=arm"), dest, [0], fork=(src, 6))
    with pytest.raises(SweepError, match=r"has no seed\(s\) \[2\] \(it has \[0, 1\]\)"):
        open_sweep(config(tmp_path / "b"), tmp_path / "b", [2], fork=(src, 4))
    with pytest.raises(SweepError, match="not a seed sweep"):
        open_sweep(config(tmp_path / "c"), tmp_path / "c", [0], fork=(src / "seed-0", 4))


def test_a_resume_on_a_full_disk_keeps_the_step_logs_and_no_half_copy(tmp_path, monkeypatch):
    """Cutting the records of lost steps copies each log: a full disk left the half copy."""
    import errno

    from agentscope_rft.runtime import fork

    lines = "".join(json.dumps({"step": s, "x": "y" * 50}) + "\n" for s in range(4))
    (tmp_path / "rollouts.jsonl").write_text(lines)
    cut_lines = fork._cut_lines

    def until_full(path: Path, out: Path, step: int) -> None:
        cut_lines(path, out, step)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fork, "_cut_lines", until_full)
    with pytest.raises(OSError, match="No space left"):
        fork.rewind_step_logs(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollouts.jsonl"]
    assert (tmp_path / "rollouts.jsonl").read_text() == lines
