"""FrozenLake as text: the map as a character grid, actions as words.

The game is gymnasium's `FrozenLakeEnv` (deterministic by default; `is_slippery` tasks use
gymnasium's slip model, seeded per episode). Every observation shows the whole map with the
player marked `P`, so the agent needs no memory of earlier turns. Each `FrozenLakeEnv` owns its
gymnasium env; episodes share nothing, and the methods never block (microseconds per step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake

from environments.frozenlake.maps import ACTION_NAMES

INSTRUCTIONS = """You are walking on a frozen lake drawn as a grid:
S = start, F = frozen ice (safe), H = hole (falling in ends the game), G = goal, P = you.
Row 1 is the top row and column 1 the leftmost column. Reach G without stepping into a hole.
Each turn, answer with one move: left, down, right or up, inside <action></action>,
for example <action>right</action>. Moving into the edge of the map leaves you in place."""

_ACTION_TAG = re.compile(r"<action>\s*(\w+)\s*</action>", re.IGNORECASE)
_ACTION_WORD = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)


def parse_action(text: str) -> int | None:
    """The action id in an agent's reply: the last `<action>word</action>`, else the last move
    word; None if there is none.

    Example:
        >>> parse_action("I should go down. <action>Right</action>")
        2
        >>> parse_action("no idea") is None
        True
    """
    tagged = _ACTION_TAG.findall(text)
    words = [word.lower() for word in tagged] or [w.lower() for w in _ACTION_WORD.findall(text)]
    for word in reversed(words):
        if word in ACTION_NAMES:
            return ACTION_NAMES.index(word)
    return None


def render(desc: list[str], row: int, col: int) -> str:
    """The map with the player marked `P`, one space-separated row per line."""
    lines = []
    for r, line in enumerate(desc):
        cells = ["P" if (r, c) == (row, col) else cell for c, cell in enumerate(line)]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def _direction(before: tuple[int, int], after: tuple[int, int]) -> str:
    d_row, d_col = after[0] - before[0], after[1] - before[1]
    return {(0, -1): "left", (1, 0): "down", (0, 1): "right", (-1, 0): "up"}[(d_row, d_col)]


@dataclass(frozen=True)
class StepResult:
    """The outcome of a reset or a move.

    Attributes:
        text: What the agent reads: what happened, the map, and its position.
        reward: 1.0 on reaching the goal, else 0.0.
        done: True on the goal, in a hole, or when the step budget is spent.
        won: True on reaching the goal.
        steps: Moves taken so far (invalid replies count).
    """

    text: str
    reward: float
    done: bool
    won: bool
    steps: int


class FrozenLakeEnv:
    """One text FrozenLake episode over a task row.

    Args:
        task: A row with `map` (list of strings); optional `is_slippery` (default False),
            `max_steps` (default: number of cells) and `seed` (slip randomness).

    Example:
        >>> env = FrozenLakeEnv({"map": ["SF", "HG"]})
        >>> print(env.reset().text.splitlines()[-1])
        You are at row 1, column 1.
        >>> env.step("<action>right</action>").text.splitlines()[0]
        'You move right.'
        >>> env.step("down").won
        True
    """

    def __init__(self, task: dict[str, Any]) -> None:
        self.task = task
        self.desc: list[str] = list(task["map"])
        self.max_steps = int(task.get("max_steps") or len(self.desc) * len(self.desc[0]))
        self._game = GymFrozenLake(desc=self.desc, is_slippery=bool(task.get("is_slippery")))
        self._seed = task.get("seed")
        self._position = 0
        self._steps = 0
        self._done = True

    @property
    def position(self) -> tuple[int, int]:
        """The player's (row, column), 0-based."""
        return divmod(self._position, len(self.desc[0]))

    def _view(self, message: str) -> str:
        row, col = self.position
        where = f"You are at row {row + 1}, column {col + 1}."
        return f"{message}\n{render(self.desc, row, col)}\n{where}"

    def reset(self) -> StepResult:
        """Starts the episode at `S`.

        Returns:
            The opening observation (reward 0, not done).
        """
        self._position, _ = self._game.reset(seed=self._seed)
        self._steps, self._done = 0, False
        return StepResult(self._view("A new game starts."), 0.0, False, False, 0)

    def step(self, reply: str) -> StepResult:
        """Plays the move in an agent's reply (see `parse_action`).

        A reply without a move costs a step and changes nothing.

        Args:
            reply: The agent's text.

        Returns:
            The new observation and reward.

        Raises:
            RuntimeError: If the episode is over or was never reset.
        """
        if self._done:
            raise RuntimeError("the episode is over; call reset() first")
        self._steps += 1
        action = parse_action(reply)
        won = False
        if action is None:
            message = "Invalid move: answer with <action>left|down|right|up</action>."
        else:
            before = self._position
            self._position, _, terminated, _, _ = self._game.step(action)
            row, col = self.position
            cell = self.desc[row][col]
            won = cell == "G"
            self._done = bool(terminated)
            if cell == "H":
                message = "You fell into a hole. Game over."
            elif won:
                message = "You reached the goal!"
            elif self._position == before:
                message = f"You tried to move {ACTION_NAMES[action]} but stayed in place."
            else:
                moved = _direction(divmod(before, len(self.desc[0])), (row, col))
                message = f"You move {moved}."
                if moved != ACTION_NAMES[action]:
                    message = f"You tried to move {ACTION_NAMES[action]} but slipped {moved}."
        if self._steps >= self.max_steps and not self._done:
            self._done = True
            message += " You are out of moves."
        return StepResult(self._view(message), 1.0 if won else 0.0, self._done, won, self._steps)
