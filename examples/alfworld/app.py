"""The ALFWorld example's agent: `workflows/alfworld_agent.py` with the example's settings.

`run` (CPU config) keeps the whole episode in one conversation: one merged training sample per
episode, observations masked. `run_window` shows the last turn in a fresh prompt each turn: one
sample per turn, for `advantage: stepwise` or `gigpo`. Both play at most 10 commands, list the
admissible commands, show one worked game first, and score 1.0 for a solved game, else -0.1
(Trinity's ALFWorld reward), with per-step shaping (`SHAPING`). `run_stage2` (curriculum stage 2)
allows 20 commands for all six task types and room sizes. `run_gpu` mirrors Trinity's ALFWorld
benchmark: 30 commands, no worked game (a 3B-7B instruct model follows the listed commands
without one).
"""

from __future__ import annotations

import sys
from pathlib import Path

# `workflows` and `environments` live at the repository root, next to the package; make them
# importable however the run was started (the config loads this file by path).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workflows.alfworld_agent import AlfworldAgentSettings, make_workflow

MAX_STEPS = 10
# Shaping for the 135M model, which sampled 0 wins in its first 32 episodes (and 70% of its
# commands were not admissible): -0.05 per command that is not listed, +0.2 on picking up the
# goal's object and on reaching the target with it. Success is still the game's alone.
SHAPING = {"invalid_command_reward": -0.05, "subgoal_reward": 0.2}

# The CPU config warms up on the scripted searcher's games (data/demos.jsonl), so the agent needs
# no worked game in its prompt.
FULL_SETTINGS = AlfworldAgentSettings(max_steps=MAX_STEPS, demo=False, **SHAPING)
run = make_workflow(FULL_SETTINGS, name="alfworld_full")
# The agent before the warm start: one worked game shown first (SmolLM2-135M otherwise answers
# with prose), for runs from the untrained model.
run_worked_game = make_workflow(
    AlfworldAgentSettings(max_steps=MAX_STEPS, **SHAPING), name="alfworld_worked_game"
)
# The sliding-window agent of config_window.yaml (warm start on data/demos_window.jsonl: the same
# won games, replayed in this app by make_demos.py --replay-in run_window).
run_window = make_workflow(
    AlfworldAgentSettings(max_steps=MAX_STEPS, context="window", window=1, demo=False, **SHAPING),
    name="alfworld_window",
)
run_stage2 = make_workflow(AlfworldAgentSettings(max_steps=20, demo=False), name="alfworld_stage2")
GPU_SETTINGS = AlfworldAgentSettings(max_steps=30, demo=False)
run_gpu = make_workflow(GPU_SETTINGS, name="alfworld_gpu")
