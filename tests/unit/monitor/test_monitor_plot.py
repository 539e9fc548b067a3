"""Reward-curve plots and the `plot` command."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import typer
from PIL import Image
from rich.console import Console
from typer.testing import CliRunner

from agentscope_rft.monitor import (
    MetricsFileError,
    Monitor,
    MonitorConfig,
    plot_command,
    plot_run,
)
from agentscope_rft.monitor.plot import moving_average

from .synthetic import write_synthetic_run


def _png_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def test_plot_run_two_panels(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path, steps=60)
    out = plot_run(tmp_path)
    assert out == tmp_path / "reward_curve.png"
    width, height = _png_size(out)
    assert width > 800 and height > 650  # reward panel + success-rate panel
    assert not list(tmp_path.glob(".*partial"))


def test_plot_run_one_panel_min_max_band_and_custom_out(tmp_path: Path) -> None:
    path = write_synthetic_run(tmp_path, steps=30, with_std=False)
    path.write_text(path.read_text().replace(', "success_rate"', ', "other"'))
    out = plot_run(path, tmp_path / "plots" / "curve.png")  # a metrics file works too
    width, height = _png_size(out)
    assert width > 800 and 300 < height < 600


def test_plot_run_single_step(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time": 5.0, "reward/mean": 0.5}\n')
    assert _png_size(plot_run(tmp_path))[0] > 0


def test_plot_run_without_reward_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    with pytest.raises(MetricsFileError, match="no 'reward/mean' in 1 records"):
        plot_run(tmp_path)


def test_plot_run_broken_file_names_file_and_line(tmp_path: Path) -> None:
    path = write_synthetic_run(tmp_path, steps=5)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-5]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MetricsFileError, match=re.escape(f"{path} line 3: not valid JSON")):
        plot_run(tmp_path)


def test_plot_run_line_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = write_synthetic_run(tmp_path, steps=3)
    with path.open("ab") as handle:
        handle.write(b'{"step": 9, "note": "caf\xe9"}\n')  # a hand edit in Latin-1
    with pytest.raises(MetricsFileError, match=re.escape(f"{path} line 4: not UTF-8 text")):
        plot_run(tmp_path)


def test_moving_average_by_hand() -> None:
    values = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    assert moving_average(values, 3).tolist() == [0.0, 0.5, 1.0, 2.0, 5.0]


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("plot")(plot_command)
    app.command("noop")(lambda: None)  # two commands: `plot` stays a subcommand
    return app


def test_plot_command(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path, steps=10)
    result = CliRunner().invoke(_cli(), ["plot", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(tmp_path / "reward_curve.png")
    out = tmp_path / "x.png"
    result = CliRunner().invoke(_cli(), ["plot", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0 and out.is_file()


def test_plot_command_error_names_the_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(_cli(), ["plot", str(tmp_path)])
    assert result.exit_code == 2
    assert f"no metrics file {tmp_path / 'metrics.jsonl'}" in result.output.replace("\n", "")


def test_plot_to_a_folder_or_under_a_file_is_a_clear_error(tmp_path: Path) -> None:
    """`--out plots/` (a folder) and a path under a file ended in tracebacks."""
    write_synthetic_run(tmp_path, steps=3)
    folder = tmp_path / "plots"
    folder.mkdir()
    result = CliRunner().invoke(_cli(), ["plot", str(tmp_path), "--out", str(folder)])
    assert result.exit_code == 2, result.output
    output = "".join(result.output.split())  # the console wraps long lines
    assert f"--out{folder}isafolder:givethePNGtowrite" in output
    under_a_file = tmp_path / "metrics.jsonl" / "x.png"
    result = CliRunner().invoke(_cli(), ["plot", str(tmp_path), "--out", str(under_a_file)])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'metrics.jsonl'}:Fileexists" in "".join(result.output.split())


def test_plot_of_a_sweep_folder_points_to_its_seeds(tmp_path: Path) -> None:
    (tmp_path / "sweep.json").write_text("{}")
    result = CliRunner().invoke(_cli(), ["plot", str(tmp_path)])
    assert result.exit_code == 2
    output = "".join(result.output.split())  # the console wraps long lines
    assert "isaseedsweep" in output and f"plot{tmp_path / 'seed-0'}" in output
    assert f"sweep-summary{tmp_path}" in output


def test_monitor_plots_every_n_steps_and_at_close(tmp_path: Path) -> None:
    cfg = MonitorConfig(plot_every=2, tensorboard=False)
    out = io.StringIO()
    monitor = Monitor(
        tmp_path, cfg, run_name="t", resolved_config={}, console=Console(file=out, width=200)
    )
    monitor.log(1, {"reward/mean": 0.1})
    assert not (tmp_path / "reward_curve.png").exists()
    monitor.log(2, {"reward/mean": 0.2, "my_metric": 3.0})
    first = (tmp_path / "reward_curve.png").stat().st_mtime_ns
    monitor.log(3, {"reward/mean": 0.3}, phase="eval")
    monitor.close()
    monitor.close()  # idempotent
    assert (tmp_path / "reward_curve.png").stat().st_mtime_ns >= first
    assert out.getvalue().splitlines() == [
        "step 1 | reward 0.10",
        "step 2 | reward 0.20",
        "[eval] step 3 | reward 0.30",
    ]
    with pytest.raises(RuntimeError, match="after close"):
        monitor.log(4, {"reward/mean": 0.4})


def test_monitor_without_rewards_closes_without_a_plot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = MonitorConfig(tensorboard=False, console=False)
    with Monitor(tmp_path, cfg, run_name="t", resolved_config={}) as monitor:
        monitor.log(1, {"loss": 0.5})
    assert not (tmp_path / "reward_curve.png").exists()
    assert "no reward curve" in caplog.text


def test_monitor_rejects_bad_input(tmp_path: Path) -> None:
    cfg = MonitorConfig(tensorboard=False, console=False)
    with Monitor(tmp_path, cfg, run_name="t", resolved_config={}) as monitor:
        with pytest.raises(ValueError, match="phase 'Eval'"):
            monitor.log(1, {"reward/mean": 0.1}, phase="Eval")
        with pytest.raises(ValueError, match="phase 'resume'"):
            monitor.log(1, {"reward/mean": 0.1}, phase="resume")
        with pytest.raises(TypeError):
            monitor.log(1.5, {"reward/mean": 0.1})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'step' is reserved"):
            monitor.log(1, {"step": 3})
        monitor.log(np.int64(2), {"reward/mean": np.float32(0.5)})
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_a_full_disk_at_close_leaves_the_runs_own_error_and_no_partial_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk that stopped the run is full still when the monitor closes: writing status.json
    and the reward curve fail too, and must not put their error in place of the run's."""
    import errno

    from matplotlib.figure import Figure

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def savefig_until_full(self: Figure, path: Path, **kwargs: object) -> None:
        Path(path).write_bytes(b"\x89PNG")  # the start of the file, then no room
        full()

    cfg = MonitorConfig(tensorboard=False, console=False)
    monitor = Monitor(tmp_path, cfg, run_name="t", resolved_config={})
    with pytest.raises(KeyError, match="the run's own"), monitor:
        monitor.log(1, {"reward/mean": 0.5})
        monkeypatch.setattr("agentscope_rft.monitor.monitor.run_ended", full)
        monkeypatch.setattr(Figure, "savefig", savefig_until_full)
        raise KeyError("the run's own")
    assert not list(tmp_path.glob(".*partial"))
    assert "could not record the run's end" in caplog.text and "no reward curve" in caplog.text
