"""ALFWorld, offline: generated household games and real ALFWorld data through one interface.

Example:
    >>> import asyncio
    >>> from environments.alfworld import AlfworldEnv, load_tasks
    >>> async def first_step():
    ...     with AlfworldEnv(load_tasks("test")[0]) as env:
    ...         observation = await env.reset()
    ...         return (await env.step("look")).done
    >>> asyncio.run(first_step())
    False
"""

from typing import Any

from environments.alfworld.env import (
    DEFAULT_MAX_STEPS,
    AlfworldEnv,
    Observation,
    StepResult,
    normalize_command,
    reward,
)
from environments.alfworld.tasks import DATA_DIR, TASK_TYPES, load_tasks, make_household

__all__ = [
    "DATA_DIR",
    "DEFAULT_MAX_STEPS",
    "TASK_TYPES",
    "AlfworldEnv",
    "Observation",
    "StepResult",
    "export_games",
    "find_games",
    "load_tasks",
    "make_household",
    "normalize_command",
    "reward",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: `python -m environments.alfworld.real` runs that module as
    # __main__, and runpy warns when the package has imported it already.
    if name in ("export_games", "find_games"):
        from environments.alfworld import real

        return getattr(real, name)
    raise AttributeError(f"module 'environments.alfworld' has no attribute {name!r}")
