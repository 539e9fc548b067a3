"""The shared engine contract, run against the vLLM engine in both chat renderings."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentscope_rft.engines.vllm import VLLMEngine

from ..engine_contract import run_contract

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


@pytest.mark.parametrize("rendering", ["engine", "vllm"])
async def test_vllm_engine_passes_the_engine_contract(
    vllm_engine: VLLMEngine, smollm2_path: Path, rendering: str
) -> None:
    vllm_engine.chat_rendering = rendering  # type: ignore[assignment]
    try:
        # vLLM's own rendering re-tokenizes the history, so exact reuse is not promised there.
        await run_contract(
            vllm_engine, weights=smollm2_path, exact_prompt_reuse=rendering == "engine"
        )
    finally:
        vllm_engine.chat_rendering = "engine"
