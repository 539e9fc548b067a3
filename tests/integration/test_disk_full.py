"""A disk that fills up while a run writes: one clear error, and nothing stored before is lost.

The full disk is simulated: the writes chosen raise `OSError(ENOSPC)` (or what `torch.save`
raises instead) after writing part of their file, as a real full disk leaves them.
"""

from __future__ import annotations

import errno
import json

import pytest

from agentscope_rft.monitor.records import read_metrics
from agentscope_rft.runtime.disk import DiskFullError
from agentscope_rft.runtime.local import train
from agentscope_rft.trainers.torch_trainer import TorchTrainer
from tests.integration.test_train_only import config, fill


def full_from_step(monkeypatch: pytest.MonkeyPatch, step: int, error: Exception) -> None:
    """`TorchTrainer.save` of checkpoint `step` and later writes half a file, then fails."""
    save = TorchTrainer.save

    def save_until_full(self, directory):
        if int(directory.name.removeprefix("step-")) < step:
            return save(self, directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "trainer.pt").write_bytes(b"\0" * 4096)
        raise error

    monkeypatch.setattr(TorchTrainer, "save", save_until_full)


async def test_a_checkpoint_that_fills_the_disk_stops_the_run_with_one_clear_error_and_resumes(
    tiny_model_path, tmp_path, monkeypatch
):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    await fill(url, 3)
    run_dir = tmp_path / "run"
    full_from_step(monkeypatch, 2, OSError(errno.ENOSPC, "No space left on device"))

    with pytest.raises(DiskFullError) as stopped:
        await train(config(tiny_model_path, url, run_dir, 3), run_dir)

    message = str(stopped.value)
    assert f"no space left on the disk of {run_dir}" in message
    assert str(run_dir / "checkpoints" / "step-000002") in message
    assert "resume from step 1 (state.json)" in message
    assert "run.keep_checkpoints: 2" in message
    # the cut-off checkpoint is gone (it held the space); the one before is whole
    assert not (run_dir / "checkpoints" / "step-000002").exists()
    assert (run_dir / "checkpoints" / "step-000001" / "run_state.json").is_file()
    assert json.loads((run_dir / "state.json").read_text())["step"] == 1
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "ended" and status["error"].startswith("DiskFullError: no space")

    monkeypatch.undo()  # room again
    await train(config(tiny_model_path, url, run_dir, 3), run_dir, resume=True)
    trained = [r.step for r in read_metrics(run_dir / "metrics.jsonl") if r.phase == "train"]
    assert trained == [0, 1, 2]  # step 1 (its checkpoint lost, never logged) trained on resume
    assert json.loads((run_dir / "state.json").read_text())["step"] == 3


async def test_a_metrics_line_that_fills_the_disk_names_the_run_folder_and_the_fix(
    tiny_model_path, tmp_path, monkeypatch
):
    from agentscope_rft.monitor.records import MetricsWriter

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    await fill(url, 2)
    run_dir = tmp_path / "run"
    write = MetricsWriter.write

    def write_until_full(self, step, time, phase, metrics):
        if step >= 1:
            self._file.write('{"step": 1, "ti')  # torn: the disk filled mid-line
            self._file.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, step, time, phase, metrics)

    monkeypatch.setattr(MetricsWriter, "write", write_until_full)
    with pytest.raises(DiskFullError, match=r"no space left on the disk of .*--resume") as stopped:
        await train(config(tiny_model_path, url, run_dir, 2), run_dir)
    assert str(run_dir) in str(stopped.value)
    assert [r.step for r in read_metrics(run_dir / "metrics.jsonl")] == [0]  # torn line skipped


async def test_a_run_folder_deleted_mid_run_stops_the_run_rather_than_making_it_again(
    tiny_model_path, tmp_path, monkeypatch
):
    """Saving a checkpoint made the deleted folder again (checkpoints/ alone, beside a state.json
    naming it), and the run went on writing its metrics into the deleted files."""
    import shutil

    from agentscope_rft.runtime.components import RunFolderError

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    await fill(url, 2)
    run_dir = tmp_path / "run"
    step = TorchTrainer.step

    def step_then_gone(self, samples, number):
        if number == 1:
            shutil.rmtree(run_dir)
        return step(self, samples, number)

    monkeypatch.setattr(TorchTrainer, "step", step_then_gone)
    with pytest.raises(RunFolderError, match=rf"the run folder {run_dir} is gone \(deleted"):
        await train(config(tiny_model_path, url, run_dir, 2), run_dir)
    assert not run_dir.exists()


async def test_a_write_into_a_deleted_run_folder_names_the_folder(tmp_path, monkeypatch):
    import shutil

    from agentscope_rft.runtime import local
    from agentscope_rft.runtime.components import RunFolderError

    run_dir = tmp_path / "run"
    run_dir.mkdir()

    class Gone:
        def __init__(self, *args, **kwargs) -> None:
            pass

        async def run(self):
            shutil.rmtree(run_dir)
            raise FileNotFoundError(2, "No such file or directory", str(run_dir / "x.jsonl"))

    monkeypatch.setattr(local, "TrainingRun", Gone)
    monkeypatch.setattr(local, "preflight", lambda config: None)
    cfg = config("unused-model", f"sqlite:///{tmp_path / 'b.db'}", run_dir, 1)
    with pytest.raises(RunFolderError, match=r"is gone .* Put it back and `agentscope-rft train"):
        await train(cfg, run_dir)


async def test_a_run_folder_refused_for_a_full_disk_is_said_once(tmp_path, monkeypatch):
    from agentscope_rft.runtime import local
    from agentscope_rft.runtime.components import RunFolderError, unwritable

    run_dir = tmp_path / "run"
    refused = unwritable(run_dir, OSError(errno.ENOSPC, "No space left on device"))

    class Refused:
        def __init__(self, *args, **kwargs) -> None:
            pass

        async def run(self):
            raise refused

    monkeypatch.setattr(local, "TrainingRun", Refused)
    monkeypatch.setattr(local, "preflight", lambda config: None)
    cfg = config("unused-model", f"sqlite:///{tmp_path / 'b.db'}", run_dir, 1)
    with pytest.raises(RunFolderError) as error:
        await train(cfg, run_dir)
    assert error.value is refused  # not wrapped in a second full-disk message
