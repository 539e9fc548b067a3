"""The ALFWorld example's agent: `workflows/alfworld_agent.py` with the CPU example's settings.

`run` keeps the whole episode in one conversation (one merged training sample per episode);
`run_window` shows the last turn in a fresh prompt each turn (one sample per turn, for
`advantage: stepwise` or `gigpo`). Both play at most 8 commands, list the admissible commands,
and score 1.0 for a solved game, else -0.1 (Trinity's ALFWorld reward).
"""

from __future__ import annotations

from workflows.alfworld_agent import AlfworldAgentSettings, make_workflow

MAX_STEPS = 8

run = make_workflow(AlfworldAgentSettings(max_steps=MAX_STEPS), name="alfworld_full")
run_window = make_workflow(
    AlfworldAgentSettings(max_steps=MAX_STEPS, context="window", window=1), name="alfworld_window"
)
