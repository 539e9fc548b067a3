"""The embedded engine passes the engine contract (the vLLM engine runs the same checks)."""

from pathlib import Path

from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.models import EMBEDDED_MODEL, resolve_model

from .engine_contract import run_contract


async def test_embedded_engine_passes_the_contract():
    path = resolve_model(EMBEDDED_MODEL)
    engine = EmbeddedEngine(path, device="cpu", max_model_len=1024)
    await engine.start()
    try:
        await run_contract(engine, weights=Path(path))
    finally:
        await engine.close()
