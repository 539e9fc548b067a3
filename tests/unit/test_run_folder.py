"""Where a new run may start: never over another run, but beside an `explore` baseline."""

import pytest

from agentscope_rft.config import load_config
from agentscope_rft.runtime.components import RunFolderError, prepare_run_dir

CONFIG = load_config(None, ["workflow=app.py:run", "tasks.train=tasks.jsonl"])


def test_a_new_run_starts_beside_explore_results_and_a_failed_starts_config(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "explore-train").mkdir(parents=True)
    (run_dir / "explore-train" / "results.jsonl").write_text("{}\n")
    (run_dir / "config.yaml").write_text("left: over\n")  # a start that failed before work
    prepare_run_dir(CONFIG, run_dir, resume=False).release()
    assert (run_dir / "explore-train" / "results.jsonl").read_text() == "{}\n"  # kept
    assert "left: over" not in (run_dir / "config.yaml").read_text()


def test_a_folder_with_a_run_is_refused_and_kept(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "state.json").write_text('{"step": 3}')
    with pytest.raises(RunFolderError, match=r"already exists: resume it with .*--resume"):
        prepare_run_dir(CONFIG, run_dir, resume=False)
    (run_dir / "state.json").unlink()
    (run_dir / "buffer.db").write_text("x")
    # nothing to resume: the message does not send the user to --resume
    with pytest.raises(RunFolderError, match=r"with buffer\.db but no checkpoint to resume from"):
        prepare_run_dir(CONFIG, run_dir, resume=False)
    assert (run_dir / "buffer.db").read_text() == "x"


def test_a_run_folder_in_use_is_refused_until_its_run_ends(tmp_path):
    run_dir = tmp_path / "run"
    running = prepare_run_dir(CONFIG, run_dir, resume=False)
    (run_dir / "state.json").write_text('{"step": 1}')
    with pytest.raises(RunFolderError, match=r"is in use by another `agentscope-rft train`"):
        prepare_run_dir(CONFIG, run_dir, resume=True)  # a second process resuming it
    running.release()
    prepare_run_dir(CONFIG, run_dir, resume=True).release()


def test_overwrite_replaces_the_contents_and_keeps_the_lock(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "state.json").write_text('{"step": 1}')
    config = load_config(None, ["workflow=app.py:run", "tasks.train=t.jsonl", "run.overwrite=true"])
    lock = prepare_run_dir(config, run_dir, resume=False)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]
    with pytest.raises(RunFolderError, match="is in use"):
        prepare_run_dir(config, run_dir, resume=False)
    lock.release()
