"""A vLLM server that cannot start is one `error:` line from the CLI, not a traceback; a setting
it would refuse is refused before it starts.

Needs no vLLM: the project's own interpreter (which has none) stands in for the vLLM one, so the
server exits during start-up as a server given a bad setting does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentscope_rft.config import ConfigError, load_config
from agentscope_rft.runtime.preflight import preflight

APP = str(Path(__file__).with_name("toy_app.py")) + ":run"


def test_a_server_that_exits_during_start_up_is_a_one_line_error(
    tiny_model_path, toy_tasks, tmp_path
):
    run_dir = tmp_path / "run"
    sets = [
        f"model.name_or_path={tiny_model_path}",
        f"workflow={APP}",
        f"tasks.train={toy_tasks}",
        "engine.type=vllm",
        f"engine.python={sys.executable}",
        "engine.startup_timeout=120",
        f"run.dir={run_dir}",
        "monitor.tensorboard=false",
    ]
    command = [sys.executable, "-m", "agentscope_rft.cli", "train"]
    for item in sets:
        command += ["--set", item]
    env = {**os.environ, "COLUMNS": "1000"}  # long paths are not wrapped
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    lines = output.splitlines()
    [at] = [i for i, x in enumerate(lines) if x.startswith("error:")]
    line, cause = lines[at], lines[at + 1]
    log = run_dir / "logs" / "vllm-replica-0.log"
    assert "vLLM server replica-0 at http://127.0.0.1:" in line and str(log) in line
    assert "exited with code 1 during start-up; the interpreter has no vLLM" in line
    assert "scripts/install_vllm.sh" in line
    assert cause.startswith("first error in the log: ") and "No module named" in cause
    assert "--- last lines of" not in output  # the log tail stays in the log
    assert "No module named 'vllm'" in log.read_text()


@pytest.mark.parametrize("engine", ["vllm", "embedded"])
def test_a_context_window_longer_than_the_models_is_refused_first(
    engine, tiny_model_path, toy_tasks, tmp_path
):
    """vLLM refused it after its start-up; the embedded engine shortened it without a word."""
    sets = [
        f"model.name_or_path={tiny_model_path}",
        f"workflow={APP}",
        f"tasks.train={toy_tasks}",
        f"engine.type={engine}",
        f"engine.python={sys.executable}" if engine == "vllm" else "engine.device=cpu",
        f"run.dir={tmp_path / 'run'}",
    ]
    with pytest.raises(ConfigError) as error:
        preflight(load_config(None, [*sets, "model.max_model_len=100000"]))
    assert str(error.value) == (
        "model.max_model_len 100000 is longer than the model's context window "
        f"(max_position_embeddings 8192 in {tiny_model_path}/config.json); set it to at most "
        "8192, or leave it unset to use 8192"
    )
    preflight(load_config(None, [*sets, "model.max_model_len=8192"]))
