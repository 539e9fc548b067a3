"""FrozenLake task files and the episode reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from environments.frozenlake.env import StepResult
from environments.frozenlake.maps import shortest_path
from environments.jsonl import TaskFileError, read_jsonl

DATA_DIR = Path(__file__).parent / "data"
"""The committed task sets: 1,000 train and 200 test maps, sizes 4 to 8."""


def load_tasks(split_or_path: str | Path = "test") -> list[dict[str, Any]]:
    """FrozenLake rows: `"train"`/`"test"` for the shipped sets, or a JSONL path.

    Raises:
        TaskFileError: On a broken line, a malformed map, or one whose goal cannot be reached.

    Example:
        >>> load_tasks("test")[0]["map"][0][0]
        'S'
    """
    shipped = split_or_path in ("train", "test")
    path = DATA_DIR / f"{split_or_path}.jsonl" if shipped else split_or_path
    rows = read_jsonl(path, required=("id", "map"))
    for row in rows:
        desc = row["map"]
        if (
            not isinstance(desc, list)
            or not desc
            or any(not isinstance(line, str) or len(line) != len(desc[0]) for line in desc)
            or "".join(desc).count("S") != 1
            or set("".join(desc)) - set("SFHG")
        ):
            raise TaskFileError(
                f"{path}: task {row['id']!r}: 'map' must be equal-length rows of S/F/H/G with one S"
            )
        # A lake whose goal cannot be reached scores 0 whatever the agent does.
        if shortest_path(desc) is None:
            raise TaskFileError(
                f"{path}: task {row['id']!r}: no path from S to a G that avoids the holes; fix "
                "the map or drop the task"
            )
    return rows


def reward(result: StepResult) -> float:
    """The episode reward from its last step: 1.0 if the goal was reached, else 0.0."""
    return 1.0 if result.won else 0.0
