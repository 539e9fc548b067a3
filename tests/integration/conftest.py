"""Fixtures shared by integration tests: engines and gateways on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine, scripted_model

from . import calc_app


@pytest.fixture(scope="session")
def toy_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 prompt-only tasks (`{"id": "t<i>", "prompt": "Say something <i>"}`), for loop tests."""
    path = tmp_path_factory.mktemp("toy") / "tasks.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "prompt": f"Say something {i}"}) + "\n" for i in range(16)
        )
    )
    return path


@pytest.fixture(scope="session")
def calc_conversation() -> tuple[list[dict], list[dict]]:
    """The exact messages and tools the calculator agent sends in its scripted episode."""
    import asyncio

    script = iter(calc_app.SCRIPT)
    engine = ScriptedEngine(lambda messages, tools: next(script))

    async def capture() -> None:
        async with Gateway(engine) as gateway:
            await calc_app.run_episode(gateway.rollout_base_url("capture"))

    asyncio.run(capture())
    last = engine.requests[-1]
    assert last.tools is not None
    return [*last.messages, {"role": "assistant", "content": calc_app.SCRIPT[-1]}], last.tools


@pytest.fixture(scope="session")
def calc_model_path(calc_conversation) -> str:
    """A tiny model that plays the calculator episode (tool calls included), greedy."""
    return str(scripted_model([calc_conversation]))


@pytest.fixture
async def tiny_gateway(tiny_model_path):
    engine = EmbeddedEngine(
        tiny_model_path, dtype="float32", device="cpu", max_model_len=512, served_model_name="tiny"
    )
    await engine.start()
    gateway = Gateway(engine)
    await gateway.start()
    yield gateway
    await gateway.stop()
    await engine.close()


@pytest.fixture
async def calc_gateway(calc_model_path):
    engine = EmbeddedEngine(calc_model_path, dtype="float32", device="cpu")
    await engine.start()
    # Greedy for every caller: the scripted model gives each script token p >= 0.98, so an
    # episode sampled at temperature 1 follows the script only by the luck of the random stream.
    gateway = Gateway(engine, sampling_overrides={"": {"temperature": 0.0}})
    await gateway.start()
    yield gateway
    await gateway.stop()
    await engine.close()
