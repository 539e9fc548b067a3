"""Fixtures shared by integration tests: engines and gateways on loopback."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agentscope_rft.engines.chat import PromptBuilder
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


SHARED_ENGINE_FIXTURES = ("tiny_gateway", "calc_gateway")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test on a shared engine's gateway must run on the session's event loop, where the
    gateway serves: on a loop of its own it would wait for replies forever."""
    for item in items:
        if not set(SHARED_ENGINE_FIXTURES) & set(getattr(item, "fixturenames", ())):
            continue
        marker = item.get_closest_marker("asyncio")
        if marker is None or marker.kwargs.get("loop_scope") != "session":
            raise pytest.UsageError(
                f"{item.nodeid} uses a shared engine's gateway ({', '.join(SHARED_ENGINE_FIXTURES)}"
                '): add `pytestmark = pytest.mark.asyncio(loop_scope="session")` to its module'
            )


@contextlib.asynccontextmanager
async def fresh_gateway(engine: EmbeddedEngine, **kwargs: Any) -> AsyncIterator[Gateway]:
    """A new gateway (recorder, counters, rollouts) on a shared, started engine, which it leaves
    as a fresh engine is: no rollout's turns kept for prompt reuse, an empty prefix cache. A test
    that swaps the engine's weights needs an engine of its own (the check after says so)."""
    engine.prompts = PromptBuilder(engine.renderer, reuse=engine.prompts.reuse)
    await engine.release_caches()
    async with Gateway(engine, **kwargs) as gateway:
        yield gateway
    assert engine.policy_version == 0, "this test changed the shared engine's weights"


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def tiny_engine(tiny_model_path: str) -> AsyncIterator[EmbeddedEngine]:
    """The tiny model's engine, started once for the session (~1 s a start); tests get it
    through `tiny_gateway`."""
    engine = EmbeddedEngine(
        tiny_model_path, dtype="float32", device="cpu", max_model_len=512, served_model_name="tiny"
    )
    await engine.start()
    yield engine
    await engine.close()


@pytest_asyncio.fixture(loop_scope="session")
async def tiny_gateway(tiny_engine: EmbeddedEngine) -> AsyncIterator[Gateway]:
    async with fresh_gateway(tiny_engine) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def calc_engine(calc_model_path: str) -> AsyncIterator[EmbeddedEngine]:
    engine = EmbeddedEngine(calc_model_path, dtype="float32", device="cpu")
    await engine.start()
    yield engine
    await engine.close()


@pytest_asyncio.fixture(loop_scope="session")
async def calc_gateway(calc_engine: EmbeddedEngine) -> AsyncIterator[Gateway]:
    # Greedy for every caller: the scripted model gives each script token p >= 0.98, so an
    # episode sampled at temperature 1 follows the script only by the luck of the random stream.
    async with fresh_gateway(calc_engine, sampling_overrides={"": {"temperature": 0.0}}) as gateway:
        yield gateway
