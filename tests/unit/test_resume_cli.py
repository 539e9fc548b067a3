"""`train --resume` (or `--config`) given what it cannot use: one line that names the problem and
the fix."""

import os
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from agentscope_rft.cli import app
from agentscope_rft.config import dump_config, load_config


def run_cli(*args: str) -> tuple[int, str]:
    """`train ARGS` in this process (a subprocess per case cost seconds of imports each);
    the exit code and what the command printed."""
    result = CliRunner().invoke(app, ["train", *args], env={"COLUMNS": "1000"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def one_line(outcome: tuple[int, str]) -> str:
    code, output = outcome
    assert code == 2, output
    assert "Traceback" not in output
    return " ".join(output.split())  # the console wraps long lines


# The command as `python -m agentscope_rft.cli` runs it; at exit, the heavy modules it imported.
HEAVY_IMPORTS = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('imported:', [m for m in ('torch', 'transformers') "
    "if m in sys.modules], file=sys.stderr))\n"
    "runpy.run_module('agentscope_rft.cli', run_name='__main__')\n"
)


def run_process(*args: str) -> tuple[str, str]:
    """`python -m agentscope_rft.cli ARGS` (expected to fail): what it said, one line, and the
    heavy modules it imported."""
    env = {**os.environ, "COLUMNS": "1000"}  # long paths are not wrapped
    proc = subprocess.run(
        [sys.executable, "-c", HEAVY_IMPORTS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    *said, imported = proc.stderr.strip().splitlines()
    return one_line((proc.returncode, "\n".join(said))), imported


def test_resume_of_a_missing_folder_says_so(tmp_path):
    """The error is one line on stderr, no traceback, and it comes before torch or transformers
    is imported (seconds a user waits, and a CI test too)."""
    args = ["train", "--resume", str(tmp_path / "nope")]
    message, imported = run_process(*args)
    assert imported == "imported: []", message
    assert "nope: no such folder" in message and "start a new run with --config" in message
    assert one_line(run_cli(*args[1:])) == message  # in-process, the same line


def test_a_config_that_is_no_file_is_said_before_torch_imports(tmp_path):
    message, imported = run_process("train", "--config", str(tmp_path / "nope.yaml"))
    assert imported == "imported: []", message
    assert message == f"error: config file {tmp_path / 'nope.yaml'} does not exist"
    folder = one_line(run_cli("--config", str(tmp_path)))
    assert folder == f"error: config file {tmp_path} is a folder, not a YAML file"
    result = CliRunner().invoke(app, ["explore", "--config", str(tmp_path / "x.yml")])
    assert one_line((result.exit_code, result.output)).endswith("x.yml does not exist")


def test_a_config_given_with_resume_must_match_the_runs_own(tmp_path):
    config = tmp_path / "run.yaml"
    data = {"workflow": "app.py:run", "tasks": {"train": "t.jsonl"}, "trainer": {"lr": 1e-5}}
    config.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(load_config(config)))
    config.write_text(yaml.safe_dump({**data, "trainer": {"lr": 3e-5}}))  # edited since

    message = one_line(run_cli("--resume", str(run_dir), "--config", str(config)))
    assert f"differs from {run_dir}/config.yaml" in message
    assert "trainer.lr: 1e-05 -> 3e-05" in message and "pass the changes with --set" in message
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]  # nothing touched


def test_the_same_config_given_with_resume_is_accepted(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"workflow": "app.py:run", "tasks": {"train": "t.jsonl"}}))
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(load_config(config)))

    message = one_line(run_cli("--resume", str(run_dir), "--config", str(config)))
    assert Path(tmp_path / "app.py").name in message and "does not exist" in message  # preflight


def test_the_same_command_line_with_sets_resumes(tmp_path):
    """A job script re-runs its own command, `--config` and `--set`s included, with `--resume`:
    the run's config (made with those sets) is what the file says with them."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"workflow": "app.py:run", "tasks": {"train": "t.jsonl"}}))
    sets = ["run.mode=async", "buffer.type=sql"]
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(load_config(config, sets)))

    args = ["--resume", str(run_dir), "--config", str(config)]
    message = one_line(run_cli(*args, *[a for s in sets for a in ("--set", s)]))
    assert "differs from" not in message
    assert "does not exist" in message  # preflight ran: the config was accepted
    # a --set that changes the run on resume is accepted too; the file's own edits are not
    message = one_line(run_cli(*args, "--set", "run.mode=async", "--set", "trainer.lr=3e-6"))
    assert "differs from" in message and "buffer.type: 'sql' -> 'memory'" in message
    assert "trainer.lr" not in message


def test_resume_of_a_single_run_with_seeds_says_it_is_no_sweep(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    message = one_line(run_cli("--resume", str(run_dir), "--seeds", "0,1"))
    assert "is not a seed sweep (no sweep.json); resume a single run without --seeds" in message


def test_a_config_given_with_a_sweeps_resume_must_match_it(tmp_path):
    config = tmp_path / "run.yaml"
    data = {"workflow": "app.py:run", "tasks": {"train": "t.jsonl"}, "trainer": {"lr": 1e-5}}
    config.write_text(yaml.safe_dump(data))
    sweep_dir = tmp_path / "runs" / "run"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "config.yaml").write_text(dump_config(load_config(config)))
    (sweep_dir / "sweep.json").write_text('{"seeds": [0, 1]}')
    config.write_text(yaml.safe_dump({**data, "trainer": {"lr": 3e-5}}))

    message = one_line(run_cli("--resume", str(sweep_dir), "--config", str(config)))
    assert "trainer.lr: 1e-05 -> 3e-05" in message and "pass the changes with --set" in message
