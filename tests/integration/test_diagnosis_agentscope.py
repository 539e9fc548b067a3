"""A real AgentScope agent through `check_workflow`: the diagnosis and `gateway.runtime_state`.

The inventory example's app is a plain AgentScope 2.x agent with the default runtime-state
injection on, so its requests carry the `<system-reminder>` with the current time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentscope_rft
from agentscope_rft.gateway.runtime_state import FROZEN_TIME
from agentscope_rft.testing import ScriptedEngine

# The shared engines' gateways serve on the session's event loop (tests/integration/conftest.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "examples" / "inventory" / "app.py") + ":run"
TASK = json.loads((ROOT / "examples" / "inventory" / "tasks_val.jsonl").read_text().splitlines()[0])


def _last_user_text(messages: list[dict], tools: list[dict] | None) -> str:
    """What SmolLM2-135M did with the reminder: copy the last user message."""
    content = messages[-1]["content"]
    return content if isinstance(content, str) else content[0]["text"]


async def test_the_untrained_tiny_model_is_told_it_makes_no_tool_calls(tiny_gateway):
    report = await agentscope_rft.check_workflow(
        APP, TASK, engine=tiny_gateway.engine, timeout=120, show=False
    )
    assert report.rollout.ok and report.rollout.calls
    assert report.rollout.calls[0].tools  # the tool was offered
    codes = [f.code for f in report.findings]
    assert "no_tool_calls" in codes and "equal_rewards" not in codes  # one episode: no groups
    finding = next(f for f in report.findings if f.code == "no_tool_calls")
    assert finding.message in report.warnings and "check_stock" in finding.message
    assert "<system-reminder>" in json.dumps(report.rollout.calls[0].messages)  # kept by default


@pytest.mark.parametrize("mode", ["keep", "freeze", "drop"])
async def test_runtime_state_modes_on_a_real_agent(mode):
    engine = ScriptedEngine(_last_user_text)
    report = await agentscope_rft.check_workflow(
        APP, TASK, engine=engine, runtime_state=mode, show=False
    )
    [call] = report.rollout.calls
    sent = json.dumps(engine.requests[-1].messages)
    prompt = engine.tokenizer.decode(call.prompt_ids)
    codes = [f.code for f in report.findings]
    assert call.messages == engine.requests[-1].messages  # recorded what the engine rendered
    if mode == "drop":
        assert "<system-reminder>" not in sent and "<system-reminder>" not in prompt
        assert "echoed_runtime_state" not in codes  # it now copies the question
        assert call.content == TASK["question"]
    else:
        assert "<current-time>" in prompt
        assert "echoed_runtime_state" in codes
        echo = next(f for f in report.findings if f.code == "echoed_runtime_state")
        assert "gateway.runtime_state: drop" in echo.message
        assert (f"<current-time>{FROZEN_TIME}</current-time>" in prompt) == (mode == "freeze")
