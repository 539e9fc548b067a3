"""Workflows that misbehave on purpose, run in Ray runner processes by the runtime tests.

Each makes one real model call through the gateway first, so a lost attempt has recorded calls
that must not be trained.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

from agentscope.agent import Agent, InjectionConfig
from agentscope.message import UserMsg

import agentscope_rft

_LEAK: list[bytearray] = []


async def run(task: dict, model) -> float:
    """One agent turn, then whatever the task asks: crash, block, leak."""
    agent = Agent(
        name="runner-test",
        system_prompt="Be brief.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    await agent.reply(UserMsg(name="user", content=f"task {task['id']}"))
    agentscope_rft.emit_reward(0.25)
    how = task.get("crash")
    if how and not Path(task["marker"]).exists():
        Path(task["marker"]).write_text(str(os.getpid()))
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "segfault":
            ctypes.string_at(0)
        elif how == "exit":
            os._exit(3)
    if task.get("block"):
        time.sleep(float(task["block"]))  # synchronous: blocks this runner's event loop
    if task.get("leak_mb"):
        _LEAK.append(bytearray(os.urandom(16)) * (int(task["leak_mb"]) * 2**16))
    return 1.0
