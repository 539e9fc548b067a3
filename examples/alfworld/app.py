"""The ALFWorld example's agent: `workflows/alfworld_agent.py` with the example's settings.

`run` (CPU config) keeps the whole episode in one conversation: one merged training sample per
episode, observations masked. `run_window` shows the last turn in a fresh prompt each turn: one
sample per turn, for `advantage: stepwise` or `gigpo`. Both play at most 10 commands, list the
admissible commands, show one worked game first, and score 1.0 for a solved game, else -0.1
(Trinity's ALFWorld reward). `run_stage2` (curriculum stage 2) allows 20 commands for all six task
types and room sizes. `run_gpu` mirrors Trinity's ALFWorld benchmark: 30 commands, no
worked game (a 3B-7B instruct model follows the listed commands without one).
"""

from __future__ import annotations

import sys
from pathlib import Path

# `workflows` and `environments` live at the repository root, next to the package; make them
# importable however the run was started (the config loads this file by path).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workflows.alfworld_agent import AlfworldAgentSettings, make_workflow

MAX_STEPS = 10

run = make_workflow(AlfworldAgentSettings(max_steps=MAX_STEPS), name="alfworld_full")
run_window = make_workflow(
    AlfworldAgentSettings(max_steps=MAX_STEPS, context="window", window=1), name="alfworld_window"
)
run_stage2 = make_workflow(AlfworldAgentSettings(max_steps=20), name="alfworld_stage2")
GPU_SETTINGS = AlfworldAgentSettings(max_steps=30, demo=False)
run_gpu = make_workflow(GPU_SETTINGS, name="alfworld_gpu")
