"""`runtime/disk.py`: which failures are a full disk, and what a checkpoint cut short leaves."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from agentscope_rft.buffer.config import BufferConfig
from agentscope_rft.runtime import disk
from agentscope_rft.runtime.components import write_state
from agentscope_rft.runtime.disk import DiskFullError, is_disk_full, saving_checkpoint


def test_a_full_disk_is_known_by_its_errno_its_words_or_an_error_it_came_from():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert is_disk_full(RuntimeError("I/O error: No space left on device (os error 28)"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("writing the batch failed") from exc
    except RuntimeError as chained:
        assert is_disk_full(chained)
    assert not is_disk_full(PermissionError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("unexpected pos 576 vs 534"))


def test_a_save_failing_on_a_full_disk_without_saying_so_is_a_full_disk(tmp_path, monkeypatch):
    """torch.save reports a full disk as `unexpected pos ...`: the free space tells."""
    run_dir = tmp_path / "run"
    whole = run_dir / "checkpoints" / "step-000002"
    whole.mkdir(parents=True)
    (whole / "trainer.pt").write_bytes(b"\0" * 3000)
    (whole / "run_state.json").write_text("{}")
    write_state(run_dir, {"step": 2})
    target = run_dir / "checkpoints" / "step-000004"
    monkeypatch.setattr(disk, "free_bytes", lambda path: 1000)  # less than LOW_SPACE
    with pytest.raises(DiskFullError) as error, saving_checkpoint(run_dir, target, 3):
        target.mkdir()
        (target / "trainer.pt").write_bytes(b"\0" * 500)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert not target.exists() and (whole / "trainer.pt").is_file()
    message = str(error.value)
    assert "a checkpoint of this run takes 3.0 KB" in message  # the whole one's size
    assert "resume from step 2 (state.json)" in message
    assert "run.keep_checkpoints: 3; the disk holds 4 while a new one is saved" in message


def test_a_save_failing_for_another_reason_keeps_its_error_and_its_folder(tmp_path, monkeypatch):
    target = tmp_path / "run" / "checkpoints" / "step-000001"
    target.parents[1].mkdir()
    monkeypatch.setattr(disk, "free_bytes", lambda path: 10**12)
    with pytest.raises(PermissionError), saving_checkpoint(target.parents[1], target, 2):
        target.mkdir(parents=True)
        raise PermissionError(errno.EACCES, "Permission denied")
    assert target.is_dir()


def test_the_first_checkpoint_on_a_full_disk_says_there_is_nothing_to_resume(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = run_dir / "checkpoints" / "step-000001"
    nothing = r"no checkpoint was saved before it.*overwrite"
    with pytest.raises(DiskFullError, match=nothing), saving_checkpoint(run_dir, target, 2):
        target.mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_outside_the_run_folder_is_named_with_the_setting_that_put_it_there(
    tmp_path, monkeypatch
):
    """The buffer's SQLite file on another disk: the run folder's disk was blamed."""
    run_dir, buffer_file = tmp_path / "run", tmp_path / "data" / "buffer.db"
    run_dir.mkdir()
    monkeypatch.setattr(disk, "free_bytes", lambda path: 0 if path == buffer_file else 10**12)
    monkeypatch.setattr(disk, "disk_usage", lambda path: (0, 10**9))
    full = sqlite3.OperationalError("database or disk is full")  # no errno, no file name
    others = disk.sqlite_files(BufferConfig(type="sql", url=f"sqlite:///{buffer_file}"))
    message = str(disk.disk_full_error(run_dir, full, others))
    assert message.startswith(f"no space left on the disk of {buffer_file} (a disk of 1.0 GB, ")
    assert f"The run folder {run_dir} is intact" in message
    assert "move buffer.db to a disk with room and point buffer.url at it" in message
    assert "start the run again (--set run.overwrite=true" in message  # no state.json yet
    write_state(run_dir, {"step": 3})
    assert f"`agentscope-rft train --resume {run_dir}`" in str(
        disk.disk_full_error(run_dir, full, others)
    )


def test_a_full_disk_under_the_run_folder_names_the_run_folder_and_its_fixes(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(disk, "free_bytes", lambda path: 0)
    full = OSError(errno.ENOSPC, "No space left on device", str(run_dir / "metrics.jsonl"))
    message = str(disk.disk_full_error(run_dir, full, {tmp_path / "b.db": "buffer.url"}))
    assert message.startswith(f"no space left on the disk of {run_dir} (")
    assert "fewer run.keep_checkpoints" in message and "buffer.url" not in message


async def test_explore_on_a_full_disk_is_one_error_naming_its_folder(tmp_path, monkeypatch):
    """`explore` ended in an OSError traceback (and a 0-byte config.yaml) on a full disk."""
    import json
    from pathlib import Path

    from agentscope_rft.config import load_config
    from agentscope_rft.runtime import explore
    from agentscope_rft.runtime.components import RunFolderError

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "prompt": "Hi"}) + "\n")
    app = Path(__file__).parents[1] / "integration" / "toy_app.py"
    config = load_config(
        None, [f"workflow={app}:run", f"tasks.train={tasks}", "model.name_or_path=m"]
    )
    out_dir = tmp_path / "run" / "explore-train"
    write_text = Path.write_text

    def full(path: Path, text: str, *args, **kwargs) -> int:
        write_text(path, text[:5], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(RunFolderError) as refused:
        await explore.explore(config, out_dir)
    assert str(refused.value) == (
        f"cannot write the run folder {out_dir}: No space left on device. Give the run a folder "
        "this user can write on a disk with room (--set run.dir=<folder>)"
    )
    assert list(out_dir.iterdir()) == []  # no cut config.yaml
    monkeypatch.undo()

    async def fills_up(*args, **kwargs):  # later: a results line, the buffer
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(explore, "_explore", fills_up)
    with pytest.raises(DiskFullError, match=rf"no space left on the disk of {out_dir} \(a disk"):
        await explore.explore(config, out_dir)


def test_a_checkpoint_cut_off_by_a_full_disk_gives_back_what_its_writer_held(tmp_path):
    """torch.save's writer stayed open in the traceback's frames: the deleted checkpoint's space
    came back only after the run, so status.json could not record how it ended."""
    import weakref

    run_dir = tmp_path / "run"
    target = run_dir / "checkpoints" / "step-000001"
    target.mkdir(parents=True)
    held: list[weakref.ref] = []

    def save_until_full() -> None:
        handle = (target / "trainer.pt").open("wb")
        held.append(weakref.ref(handle))
        handle.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    try:  # (not pytest.raises: it lets the frames go itself)
        with saving_checkpoint(run_dir, target, 2):
            save_until_full()
    except DiskFullError as error:
        stopped = error
    assert isinstance(stopped.__cause__, OSError)
    assert held[0]() is None  # closed and gone, though the error is still at hand
    assert not target.exists()
