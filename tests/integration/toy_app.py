"""A learnable toy task for a tiny random model: reward = share of uppercase letters replied."""

from __future__ import annotations

from agentscope.agent import Agent, InjectionConfig
from agentscope.message import UserMsg


def uppercase_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


async def run(task: dict, model) -> float:
    agent = Agent(
        name="shouter",
        system_prompt="Reply.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    reply = await agent.reply(UserMsg(name="user", content=task["prompt"]))
    return uppercase_share(reply.get_text_content() or "")


async def broken(task: dict, model) -> float:
    raise RuntimeError("the app is broken")
