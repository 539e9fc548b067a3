"""An environment-bound agent app for the runtime benchmark (`benchmarks/ray_runtime.py`).

Each episode is an AgentScope agent acting in a synchronous environment for `steps` turns, like
an ALFWorld/TextWorld agent: one model call per turn, then one environment step that holds the
thread for `step_s` seconds, either waiting (`sleep`: a simulator or game process answering a
blocking API) or computing in Python (`cpu`: a pure-Python environment).
"""

from __future__ import annotations

import time

from agentscope.agent import Agent, InjectionConfig, ReActConfig
from agentscope.message import UserMsg


def env_step(kind: str, seconds: float) -> str:
    if kind == "sleep":
        time.sleep(seconds)
    else:
        deadline, x = time.process_time() + seconds, 0
        while time.process_time() < deadline:
            x += sum(i * i for i in range(1000))
    return "You see a countertop and a drawer."


async def run(task: dict, model) -> float:
    agent = Agent(
        name="player",
        system_prompt="You act in a text household. Answer with one action.",
        model=model,
        react_config=ReActConfig(max_iters=1),
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    observation = "You are in the kitchen."
    for _ in range(int(task["steps"])):
        await agent.reply(UserMsg(name="env", content=observation))
        observation = env_step(task["kind"], float(task["step_s"]))
    return 1.0
