"""FrozenLake as text for LLM agents: gymnasium's game, random solvable maps, a BFS oracle.

Example:
    >>> from environments.frozenlake import FrozenLakeEnv, load_tasks
    >>> env = FrozenLakeEnv(load_tasks("test")[0])
    >>> env.reset().done
    False
"""

from environments.frozenlake.env import INSTRUCTIONS, FrozenLakeEnv, StepResult, parse_action
from environments.frozenlake.maps import make_map, shortest_path
from environments.frozenlake.tasks import DATA_DIR, load_tasks, reward

__all__ = [
    "DATA_DIR",
    "INSTRUCTIONS",
    "FrozenLakeEnv",
    "StepResult",
    "load_tasks",
    "make_map",
    "parse_action",
    "reward",
    "shortest_path",
]
