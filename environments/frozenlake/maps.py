"""FrozenLake maps: gymnasium's random generator, plus a BFS solvability check and solver."""

from __future__ import annotations

from collections import deque

from gymnasium.envs.toy_text.frozen_lake import generate_random_map

# gymnasium's action ids.
LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
ACTION_NAMES = ("left", "down", "right", "up")
_MOVES = {LEFT: (0, -1), DOWN: (1, 0), RIGHT: (0, 1), UP: (-1, 0)}


def make_map(size: int, p_frozen: float, seed: int) -> list[str]:
    """A random `size` x `size` map from gymnasium, with a path from `S` to `G`.

    Args:
        size: Side length (2 or more).
        p_frozen: Probability that a tile is frozen (safe) rather than a hole; 0.6 or more
            (gymnasium redraws until the map is solvable, which takes long for sparse ice).
        seed: The map seed.

    Returns:
        Rows of `S` (start), `F` (frozen), `H` (hole) and `G` (goal).

    Raises:
        ValueError: On a size below 2 or `p_frozen` below 0.6.

    Example:
        >>> make_map(4, 0.8, seed=0)
        ['SFFF', 'HHFF', 'FHHF', 'HFFG']
    """
    if size < 2:
        raise ValueError(f"map size must be at least 2, got {size}")
    if not 0.6 <= p_frozen <= 1.0:
        raise ValueError(f"p_frozen must be in [0.6, 1.0], got {p_frozen}")
    return generate_random_map(size=size, p=p_frozen, seed=seed)


def move(desc: list[str], row: int, col: int, action: int) -> tuple[int, int]:
    """Where a non-slippery move leads (walls keep you in place)."""
    d_row, d_col = _MOVES[action]
    new_row = min(max(row + d_row, 0), len(desc) - 1)
    new_col = min(max(col + d_col, 0), len(desc[0]) - 1)
    return new_row, new_col


def shortest_path(desc: list[str], start: tuple[int, int] | None = None) -> list[int] | None:
    """The shortest action sequence from `start` (default `S`) to `G` avoiding holes, or None.

    Example:
        >>> shortest_path(["SF", "HG"])
        [2, 1]
    """
    if start is None:
        start = next(
            (r, c) for r, line in enumerate(desc) for c, cell in enumerate(line) if cell == "S"
        )
    parents: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == "G":
            path: list[int] = []
            step = parents[cell]
            while step is not None:
                cell, action = step
                path.append(action)
                step = parents[cell]
            return path[::-1]
        if desc[cell[0]][cell[1]] == "H":
            continue
        for action in (LEFT, DOWN, RIGHT, UP):
            nxt = move(desc, *cell, action)
            if nxt not in parents:
                parents[nxt] = (cell, action)
                queue.append(nxt)
    return None
