"""Reference policies for FrozenLake: a BFS oracle and uniform random moves."""

from __future__ import annotations

import random
from typing import Any

from environments.frozenlake.env import FrozenLakeEnv
from environments.frozenlake.maps import ACTION_NAMES, shortest_path


def oracle_episode(task: dict[str, Any]) -> tuple[bool, int]:
    """Plays the shortest safe path, re-planned from the current cell after every move (so it
    also copes with slips on slippery ice). Returns `(won, steps)`.

    Example:
        >>> oracle_episode({"map": ["SF", "HG"]})
        (True, 2)
    """
    env = FrozenLakeEnv(task)
    result = env.reset()
    while not result.done:
        path = shortest_path(env.desc, env.position)
        if not path:
            return False, result.steps
        result = env.step(f"<action>{ACTION_NAMES[path[0]]}</action>")
    return result.won, result.steps


def random_episode(task: dict[str, Any], rng: random.Random) -> tuple[bool, int]:
    """Plays uniformly random moves until the goal, a hole or the step budget.

    Example:
        >>> random_episode({"map": ["SF", "FG"]}, random.Random(0))[0] in (True, False)
        True
    """
    env = FrozenLakeEnv(task)
    result = env.reset()
    while not result.done:
        result = env.step(f"<action>{rng.choice(ACTION_NAMES)}</action>")
    return result.won, result.steps
