"""Apps for `benchmarks/data_side.py`: the uppercase toy task (reward = share of uppercase letters
in the reply, learnable by a tiny random model in a few steps) in a mix with tasks that are far
too easy (`kind: easy`, reward always 1) or too hard (`kind: hard`, reward always 0)."""

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
    share = uppercase_share(reply.get_text_content() or "")
    kind = task.get("kind", "learnable")
    if kind == "easy":
        return 1.0
    if kind == "hard":
        return 0.0
    return share
