"""Reference policies for ALFWorld tasks: the planner oracle and a random-command baseline."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from environments.alfworld.env import DEFAULT_MAX_STEPS, AlfworldEnv


@dataclass(frozen=True)
class Episode:
    """How an episode went.

    Attributes:
        won: Whether the task was completed within the budget.
        steps: Commands played.
        commands: The commands, in order.
    """

    won: bool
    steps: int
    commands: list[str]


async def oracle_episode(task: dict[str, Any], max_steps: int = DEFAULT_MAX_STEPS) -> Episode:
    """Plays the plan that fast-downward finds for the game at reset.

    The plan is computed by the same PDDL planner TextWorld uses for ALFWorld's expert, from the
    game's true initial state, then played command by command through the env: a win proves the
    task solvable within `max_steps`.

    Example:
        >>> import asyncio
        >>> task = {"task_type": "pick_and_place_simple", "layout": "bathroom-train-0", "seed": 0}
        >>> asyncio.run(oracle_episode(task)).won
        True
    """
    with AlfworldEnv(task, max_steps=max_steps, expert_plan=True) as env:
        observation = await env.reset()
        commands: list[str] = []
        result = None
        for command in observation.expert_plan[:max_steps]:
            result = await env.step(command)
            commands.append(command)
            if result.done:
                break
        return Episode(won=bool(result and result.won), steps=len(commands), commands=commands)


async def random_episode(
    task: dict[str, Any], rng: random.Random, max_steps: int = DEFAULT_MAX_STEPS
) -> Episode:
    """Plays uniformly random admissible commands until the task is done or the budget is spent.

    Example:
        >>> import asyncio  # doctest: +SKIP
        >>> asyncio.run(random_episode(task, random.Random(0))).won  # doctest: +SKIP
        False
    """
    with AlfworldEnv(task, max_steps=max_steps) as env:
        observation = await env.reset()
        admissible = observation.admissible_commands
        commands: list[str] = []
        while True:
            command = rng.choice(admissible)
            result = await env.step(command)
            commands.append(command)
            admissible = result.admissible_commands
            if result.done:
                return Episode(won=result.won, steps=result.steps, commands=commands)
