"""TensorBoard, W&B (offline) and MLflow (optional) behind `Monitor`."""

from __future__ import annotations

import io
import sys
import time
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agentscope_rft.monitor import MissingBackendError, Monitor, MonitorConfig

RESOLVED = {"model": {"name_or_path": "tiny-random"}, "trainer": {"lr": 1e-6}, "run_dir": Path("x")}


def _monitor(run_dir: Path, resume: bool = False, **config: Any) -> Monitor:
    cfg = MonitorConfig.model_validate({"plot_every": 0, **config})
    console = Console(file=io.StringIO())
    return Monitor(
        run_dir, cfg, run_name="test-run", resolved_config=RESOLVED, resume=resume, console=console
    )


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(event.step, round(event.value, 6)) for event in events.Scalars(tag)]


def test_tensorboard_scalars_and_config_text(tmp_path: Path) -> None:
    with _monitor(tmp_path) as monitor:
        for step in (1, 2, 3):
            monitor.log(step, {"reward/mean": step / 10, "time/train": 2.0})
        monitor.log(3, {"reward/mean": 0.9}, phase="eval")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = events.Tags()
    assert {"reward/mean", "time/train", "eval/reward/mean"} <= set(tags["scalars"])
    assert _scalars(tmp_path, "reward/mean") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert _scalars(tmp_path, "eval/reward/mean") == [(3, 0.9)]
    (config_event,) = events.Tensors("config")
    config_text = config_event.tensor_proto.string_val[0].decode()
    assert "name_or_path: tiny-random" in config_text


def test_tensorboard_resume_supersedes_the_abandoned_steps(tmp_path: Path) -> None:
    with _monitor(tmp_path) as monitor:
        for step in (1, 2, 3, 4):
            monitor.log(step, {"reward/mean": float(step)})
    with _monitor(tmp_path, resume=True) as monitor:  # resumed from the checkpoint of step 2
        monitor.log(3, {"reward/mean": 30.0})
    assert _scalars(tmp_path, "reward/mean") == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_tensorboard_can_be_off(tmp_path: Path) -> None:
    with _monitor(tmp_path, tensorboard=False) as monitor:
        monitor.log(1, {"reward/mean": 0.5})
    assert not (tmp_path / "tensorboard").exists()


def _eventually_contains(path: Path, data: bytes, timeout_s: float = 10.0) -> bool:
    """wandb-core (a separate process) may still be writing the run file when finish() returns."""
    deadline = time.monotonic() + timeout_s
    while data not in path.read_bytes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_wandb_offline_run_in_the_run_folder(tmp_path: Path) -> None:
    with _monitor(tmp_path, wandb={"enabled": True, "tags": ["unit"]}) as monitor:
        monitor.log(1, {"reward/mean": 0.5, "success_rate": 0.25})
        monitor.log(1, {"reward/mean": 0.6}, phase="eval")
    run_id = (tmp_path / "wandb_run_id.txt").read_text().strip()
    (run_folder,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    run_file = run_folder / f"run-{run_id}.wandb"
    assert _eventually_contains(run_file, b"eval/reward/mean")  # the records reached the file
    # Resuming continues the same W&B run id (`wandb sync` merges the two folders). A folder is
    # named by the second its run started: a resume in the same second as the first run (only
    # in a test) would share it, so wait that second out.
    time.sleep(1.1)
    with _monitor(tmp_path, resume=True, wandb={"enabled": True}) as monitor:
        monitor.log(2, {"reward/mean": 0.7})
    assert (tmp_path / "wandb_run_id.txt").read_text().strip() == run_id
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))) == 2


def test_mlflow_missing_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not importable, installed or not
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(MissingBackendError) as error:
        _monitor(tmp_path, mlflow={"enabled": True}, wandb={"enabled": True})
    message = str(error.value)
    assert "monitor.mlflow.enabled is true" in message
    assert "pip install 'agentscope-rft[monitor]'" in message
    # Failed before touching anything: no W&B run started, the old metrics kept.
    assert not (tmp_path / "wandb").exists()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_wandb_missing_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingBackendError, match=r"monitor\.wandb\.enabled is true"):
        _monitor(tmp_path, wandb={"enabled": True})


class FakeMlflowClient:
    """Records what the sink sends; stands in for `mlflow.MlflowClient`."""

    instances: ClassVar[list[FakeMlflowClient]] = []

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.calls: list[tuple[str, Any]] = []
        FakeMlflowClient.instances.append(self)

    def get_experiment_by_name(self, name: str) -> None:
        return None

    def create_experiment(self, name: str) -> str:
        self.calls.append(("create_experiment", name))
        return "7"

    def create_run(self, experiment_id: str, run_name: str) -> Any:
        self.calls.append(("create_run", (experiment_id, run_name)))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="run-1"))

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = ()) -> None:
        self.calls.append(("log_batch", (run_id, list(metrics), list(params))))

    def log_dict(self, run_id: str, data: dict[str, Any], path: str) -> None:
        self.calls.append(("log_dict", (run_id, path)))

    def update_run(self, run_id: str, status: str) -> None:
        self.calls.append(("update_run", (run_id, status)))

    def set_terminated(self, run_id: str, status: str) -> None:
        self.calls.append(("set_terminated", (run_id, status)))


def _fake_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = types.ModuleType("mlflow")
    entities = types.ModuleType("mlflow.entities")
    mlflow.MlflowClient = FakeMlflowClient  # type: ignore[attr-defined]
    entities.Metric = lambda key, value, timestamp, step: (key, value, step)  # type: ignore[attr-defined]
    entities.Param = lambda key, value: (key, value)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    monkeypatch.setitem(sys.modules, "mlflow.entities", entities)
    FakeMlflowClient.instances.clear()


def test_mlflow_run_gets_params_metrics_and_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_mlflow(monkeypatch)
    with (
        pytest.raises(RuntimeError, match="boom"),
        _monitor(tmp_path, mlflow={"enabled": True}) as m,
    ):
        m.log(3, {"reward/mean": 0.5})
        m.log(3, {"reward/mean": 0.6}, phase="eval")
        raise RuntimeError("boom")
    (client,) = FakeMlflowClient.instances
    assert client.tracking_uri == (tmp_path / "mlruns").resolve().as_uri()
    batches = [args for name, args in client.calls if name == "log_batch"]
    params = dict(batches[0][2])
    assert params["model.name_or_path"] == "tiny-random" and params["trainer.lr"] == "1e-06"
    assert params["run_dir"] == "x"
    assert [batch[1] for batch in batches[1:]] == [
        [("reward/mean", 0.5, 3)],
        [("eval/reward/mean", 0.6, 3)],
    ]
    assert ("log_dict", ("run-1", "config.json")) in client.calls
    assert client.calls[-1] == ("set_terminated", ("run-1", "FAILED"))
    assert (tmp_path / "mlflow_run_id.txt").read_text().strip() == "run-1"

    with _monitor(tmp_path, resume=True, mlflow={"enabled": True}) as monitor:
        monitor.log(4, {"reward/mean": 0.7})
    resumed = FakeMlflowClient.instances[-1]
    assert resumed.calls[0] == ("update_run", ("run-1", "RUNNING"))
    assert not any(name == "create_run" for name, _ in resumed.calls)
    assert resumed.calls[-1] == ("set_terminated", ("run-1", "FINISHED"))
