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
    (run_dir / "checkpoints" / "step-000001").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-000001" / "run_state.json").write_text('{"step": 1}')
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


def test_a_resume_whose_checkpoint_is_missing_or_cut_off_names_it_and_the_whole_ones(tmp_path):
    """state.json names step 4; its checkpoint folder is gone, then half-written. The resume was
    refused deep in the trainer ("does not match the model: missing [...]")."""
    run_dir = tmp_path / "run"
    whole = run_dir / "checkpoints" / "step-000002"
    whole.mkdir(parents=True)
    (whole / "run_state.json").write_text('{"step": 2}')
    (run_dir / "state.json").write_text('{"step": 4}')
    with pytest.raises(
        RunFolderError, match=r"step-000004 is missing; whole checkpoints: 2\. "
    ) as e:
        prepare_run_dir(CONFIG, run_dir, resume=True)
    assert f"--fork-from {run_dir} --fork-step 2" in str(e.value)
    (run_dir / "checkpoints" / "step-000004").mkdir()
    (run_dir / "checkpoints" / "step-000004" / "trainer.pt").write_bytes(b"")
    with pytest.raises(RunFolderError, match=r"step-000004 is incomplete \(no run_state\.json\)"):
        prepare_run_dir(CONFIG, run_dir, resume=True)
    (run_dir / "checkpoints" / "step-000004" / "run_state.json").write_text('{"step": 4}')
    prepare_run_dir(CONFIG, run_dir, resume=True).release()


def test_a_resume_killed_while_saving_the_config_keeps_the_runs_config(tmp_path, monkeypatch):
    """Each resume writes config.yaml again; a kill mid-write left half of it, and the next
    `--resume` could not read the run's config."""
    from pathlib import Path

    run_dir = tmp_path / "run"
    prepare_run_dir(CONFIG, run_dir, resume=False).release()
    saved = (run_dir / "config.yaml").read_text()
    step = run_dir / "checkpoints" / "step-000001"
    step.mkdir(parents=True)
    (step / "run_state.json").write_text('{"step": 1}')
    (run_dir / "state.json").write_text('{"step": 1}')
    write_text = Path.write_text

    def killed_midway(path: Path, text: str, *args, **kwargs) -> int:
        write_text(path, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt  # the process ends here, as a kill -9 would end it

    monkeypatch.setattr(Path, "write_text", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        prepare_run_dir(CONFIG, run_dir, resume=True)
    monkeypatch.undo()
    assert (run_dir / "config.yaml").read_text() == saved


@pytest.mark.parametrize(
    ("fails", "error"),
    [
        ("mkdir", OSError(30, "Read-only file system")),  # a new folder on a read-only disk
        ("write_text", OSError(30, "Read-only file system")),  # an existing one
        ("write_text", OSError(28, "No space left on device")),
        ("write_text", PermissionError(13, "Permission denied")),  # another user's folder
    ],
)
def test_a_run_folder_that_cannot_be_written_is_named_before_any_work(
    tmp_path, monkeypatch, fails, error
):
    from pathlib import Path

    run_dir = tmp_path / "run"
    if fails == "write_text":
        run_dir.mkdir()

    def cannot(path: Path, *args, **kwargs) -> None:
        if fails == "write_text":  # half a file, as a full disk leaves it
            (run_dir / "config.yaml.tmp").open("a").close()
        raise error

    monkeypatch.setattr(Path, fails, cannot)
    with pytest.raises(RunFolderError) as refused:
        prepare_run_dir(CONFIG, run_dir, resume=False)
    monkeypatch.undo()
    assert str(refused.value) == (
        f"cannot write the run folder {run_dir}: {error.strerror}. Give the run a folder this "
        "user can write on a disk with room (--set run.dir=<folder>)"
    )
    assert not (run_dir / "config.yaml.tmp").exists()
    prepare_run_dir(CONFIG, run_dir, resume=False).release()  # not left locked
