"""Seeds: a real `train --seeds 0,1` sweep on the tiny model, SIGKILLed while seed 1 runs, then
continued by the same command: seed 0 is skipped, seed 1 resumes from its checkpoint, and the
summary and plot are written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentscope_rft.monitor.records import RESUME_PHASE, read_metrics, surviving_history

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def sweep_command(model: str, tasks: Path, sweep: Path) -> list[str]:
    sets = [
        f"model.name_or_path={model}",
        # Episodes of 0.25 s: after its first checkpoint seed 1 runs three more steps and their
        # validations (each episode of them paused), seconds for the 0.2 s poll to find it
        f"workflow={ROOT / 'tests/integration/toy_app.py'}:paused",
        f"tasks.train={tasks}",
        f"tasks.val={tasks}",  # (the same tasks: a warning says so)
        f"tasks.test={tasks}",
        "explorer.group_size=2",
        "explorer.tasks_per_step=2",
        "explorer.eval_group_size=1",
        "explorer.sampling.max_tokens=8",
        "engine.dtype=float32",
        "trainer.dtype=float32",
        f"run.steps={STEPS}",
        "run.eval_every=1",
        "run.checkpoint_every=1",
        f"run.dir={sweep}",
        "monitor.tensorboard=false",
    ]
    args = [x for s in sets for x in ("--set", s)]
    return [sys.executable, "-m", "agentscope_rft.cli", "train", "--seeds", "0,1", *args]


def status(sweep: Path) -> dict[str, str]:
    try:
        return json.loads((sweep / "sweep.json").read_text())["status"]
    except (OSError, json.JSONDecodeError):
        return {}


def test_a_killed_sweep_continues_with_the_seeds_not_done(tiny_model_path, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"Say {i}"}) + "\n" for i in range(4))
    )
    sweep = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = sweep_command(tiny_model_path, tasks, sweep)
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 600
    try:
        # seed 0 done, seed 1 running with a checkpoint: kill the sweep there
        while not (
            status(sweep).get("0") == "done" and (sweep / "seed-1" / "state.json").is_file()
        ):
            assert first.poll() is None, first.communicate()[0].decode()[-3000:]
            assert time.time() < deadline, "seed 1 never saved a checkpoint"
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
    assert status(sweep) == {"0": "done", "1": "running"}
    seed0_metrics = (sweep / "seed-0" / "metrics.jsonl").read_text()

    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "1 of 2 seed(s) already done, skipped" in again.stderr
    assert status(sweep) == {"0": "done", "1": "done"}
    assert (sweep / "seed-0" / "metrics.jsonl").read_text() == seed0_metrics  # not rerun
    seed1 = read_metrics(sweep / "seed-1" / "metrics.jsonl")
    assert any(r.phase == RESUME_PHASE for r in seed1)  # resumed from its checkpoint
    trained = [r.step for r in surviving_history(seed1) if r.phase == "train"]
    assert trained == list(range(STEPS))  # every step of seed 1 trained once
    for seed in (0, 1):
        run_config = (sweep / f"seed-{seed}" / "config.yaml").read_text()
        assert f"  seed: {seed}\n" in run_config  # run.seed (and explorer/engine) follow

    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["best"]["n"] == 2 and summary["failed"] == []
    for seed in ("0", "1"):
        result = summary["seeds"][seed]
        assert result["phase"] == "val" and result["last"]["step"] == STEPS
        assert result["checkpoint"] == "best"
        steps = [s for s, _ in result["curve"]]
        # val before step 1 and after each step (a resume supersedes its first step's record)
        assert steps == list(range(STEPS + 1)) if seed == "0" else steps[-1] == STEPS, steps
        values = [v for _, v in result["curve"]]
        assert result["best"]["value"] == max(values)
    assert "mean ± std" in (sweep / "summary.md").read_text()
    assert (sweep / "seeds.png").stat().st_size > 10_000

    # the summary is re-made by its own command, here with each seed's best on the test split
    (sweep / "summary.json").unlink()
    remade = subprocess.run(
        [
            *(sys.executable, "-m", "agentscope_rft.cli", "sweep-summary", str(sweep), "--test"),
            *("--artefacts", str(tmp_path / "results")),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert remade.returncode == 0, remade.stderr[-2000:]
    tested = json.loads((sweep / "summary.json").read_text())
    assert tested["best"] == summary["best"]
    assert tested["test"]["reward/mean"]["n"] == 2
    for seed in (0, 1):
        results = (sweep / f"seed-{seed}" / "test-best" / "results.jsonl").read_text()
        assert len(results.splitlines()) == 4  # every test task, once
        test_config = (sweep / f"seed-{seed}" / "test-best" / "config.yaml").read_text()
        assert f"seed-{seed}/checkpoints/best/model" in test_config  # chosen on validation
    table = (sweep / "summary.md").read_text()
    assert "test reward/mean (best ckpt)" in table
    # the untrained model every seed started from, on the same test tasks, once
    untrained = (sweep / "test-untrained" / "config.yaml").read_text()
    assert f"name_or_path: {tiny_model_path}" in untrained
    assert tested["untrained"]["reward/mean"] is not None and "| untrained |" in table
    # the artefacts a README's table is committed with: small files only, an index
    results = tmp_path / "results"
    names = {str(p.relative_to(results)) for p in results.rglob("*") if p.is_file()}
    for name in ("ARTEFACTS.md", "summary.md", "sweep.json", "config.yaml", "seeds.png"):
        assert name in names, names
    for seed in (0, 1):
        for name in ("metrics.jsonl", "config.yaml", "state.json", "test-best/results.jsonl"):
            assert f"seed-{seed}/{name}" in names, names
    assert "test-untrained/summary.json" in names
    assert not any("checkpoints" in n or n.endswith(".db") for n in names), names
    index = (results / "ARTEFACTS.md").read_text()
    assert "sweep-summary" in index and "--artefacts" in index and table.strip() in index


def test_failed_seeds_are_reported_and_the_sweep_fails_at_the_end(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "prompt": "hi"}\n')
    sets = [f"run.dir={tmp_path / 'sweep'}", "workflow=missing_app.py:run", f"tasks.train={tasks}"]
    out = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "agentscope_rft.cli",
                "train",
                "--seeds",
                "0,1",
                "--parallel",
                "2",
            ),
            *(x for s in sets for x in ("--set", s)),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    said = " ".join(out.stderr.split())  # the console wraps long lines
    assert "sweep: seed 0 failed with exit code 2" in said
    assert "sweep: seed 1 failed with exit code 2" in said  # both ran (in parallel, with logs)
    assert "seed(s) [0, 1] failed" in said
    for seed in (0, 1):
        assert "missing_app.py" in (tmp_path / "sweep" / "logs" / f"seed-{seed}.log").read_text()
    assert status(tmp_path / "sweep") == {"0": "failed", "1": "failed"}
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert summary["failed"] == [0, 1] and summary["best"]["n"] == 0
