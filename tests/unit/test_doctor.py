"""`agentscope-rft doctor`: one line per check, what is missing says how to get it."""

from __future__ import annotations

import platform

from typer.testing import CliRunner

from agentscope_rft import doctor
from agentscope_rft.cli import app


def test_checks_report_installed_and_missing_packages(monkeypatch):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda p: None if p == "verl" else real(p))
    # The vLLM check starts the vLLM interpreter (slow); tests/unit/engines covers it.
    monkeypatch.setattr(doctor, "_vllm", lambda: doctor.Check("engine: vllm", False, "stub"))
    checks = {c.name: c for c in doctor.run_checks()}
    assert checks["python"].ok and checks["python"].detail == platform.python_version()
    assert checks["torch"].ok and checks["torch"].detail.startswith("torch 2.")
    assert checks["transformers"].ok and checks["transformers"].detail == (
        f"transformers {real('transformers')}"
    )
    verl = checks["trainer: verl"]
    assert not verl.ok
    assert "verl not installed" in verl.detail and "agentscope-rft[verl]" in verl.detail


def test_cli_brief_prints_one_line_per_check(monkeypatch):
    monkeypatch.setattr(
        doctor,
        "run_checks",
        lambda: [doctor.Check("python", True, "3.11"), doctor.Check("env: x", False, "x missing")],
    )
    result = CliRunner().invoke(app, ["doctor", "--brief"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "[doctor] ok python: 3.11",
        "[doctor] -- env: x: x missing",
    ]
    table = CliRunner().invoke(app, ["doctor"])
    assert table.exit_code == 0 and "x missing" in table.output and "missing" in table.output


def test_cli_brief_keeps_a_long_check_on_one_line(monkeypatch):
    """A detail longer than the terminal (an allocator's library path) was wrapped over lines,
    and `doctor --brief | grep` lost its end."""
    detail = "jemalloc (" + "/very/long/path" * 8 + "/libjemalloc.so) for run.allocator: jemalloc"
    monkeypatch.setattr(doctor, "run_checks", lambda: [doctor.Check("allocator", True, detail)])
    result = CliRunner().invoke(app, ["doctor", "--brief"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"[doctor] ok allocator: {detail}"]
