"""A closed rollout's turns kept for prompt-token reuse are dropped: before, every finished
episode's conversation stayed in the engine (up to 4,096 of them, every prompt's token ids)."""

from agentscope_rft.engines.base import ChatRequest, forget_rollout
from agentscope_rft.gateway.app import GatewayState, close_rollout
from agentscope_rft.gateway.recorder import CallRecorder
from agentscope_rft.testing import ScriptedEngine
from agentscope_rft.types import SamplingParams


async def _call(engine: ScriptedEngine, rollout_id: str, agent: str) -> None:
    request = ChatRequest(
        messages=[{"role": "user", "content": "hi"}],
        sampling=SamplingParams(max_tokens=4),
        rollout_id=rollout_id,
        agent_name=agent,
    )
    async for _ in engine.chat(request):
        pass


async def test_closing_a_rollout_drops_its_kept_turns_and_no_other():
    engine = ScriptedEngine(lambda messages, tools: "hello")
    for rollout_id, agent in [("r1", "solver"), ("r1", "judge"), ("r2", "solver")]:
        await _call(engine, rollout_id, agent)
    kept = engine.prompts._turns
    assert set(kept) == {("r1", "solver"), ("r1", "judge"), ("r2", "solver")}

    await close_rollout(GatewayState(engine, CallRecorder()), "r1", reason="finished")
    assert set(kept) == {("r2", "solver")}


def test_an_engine_without_kept_turns_is_left_alone():
    forget_rollout(object(), "r1")  # type: ignore[arg-type]
