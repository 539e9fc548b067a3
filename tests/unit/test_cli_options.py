"""Numeric command-line options out of range are refused before any work."""

import pytest
from typer.testing import CliRunner

from agentscope_rft.cli import app


@pytest.mark.parametrize(
    "args",
    [
        ["explore", "--limit", "-1"],  # was tasks[:-1]: every task but the last
        ["explore", "--limit", "0"],
        ["explore", "--group-size", "0"],  # was the config's group size
        ["serve", "--max-batch-size", "0"],
        ["serve", "--port", "70000"],
        ["dashboard", "--port", "-5"],
    ],
)
def test_out_of_range_options_are_usage_errors(args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.output


def test_a_finished_run_names_its_curve_only_when_one_was_drawn(tmp_path):
    from agentscope_rft.cli import _done_line

    offline = _done_line(tmp_path, {"loss": 0.69315, "time/step": 1.0})  # SFT/DPO: no reward
    assert offline == f"[bold green]done[/] {tmp_path}: {{'loss': 0.6932, 'time/step': 1.0}}"
    (tmp_path / "reward_curve.png").write_bytes(b"\x89PNG")
    assert _done_line(tmp_path, {"reward/mean": 0.5}).endswith(
        f"{{'reward/mean': 0.5}}; curve: {tmp_path / 'reward_curve.png'}"
    )


def test_serve_on_a_port_in_use_fails_before_the_model_loads(monkeypatch):
    """The port was found taken only after the engine had started (minutes with vLLM)."""
    import socket

    from agentscope_rft.engines import factory

    def loads(*args, **kwargs):
        raise AssertionError("the engine was built before the port was checked")

    monkeypatch.setattr(factory, "build_engine", loads)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--port", str(port)], env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use); pick another" in (
        result.output
    )


def test_export_under_a_file_is_one_error_line_and_leaves_nothing(tmp_path):
    """An --out under a file ended in a NotADirectoryError traceback."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = model / "config.json" / "exported"
    args = ["export", str(model), "--out", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert f"cannot write {out}: " in result.output
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]
