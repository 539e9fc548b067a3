"""The ALFWorld episode interface: `reset()` -> observation, `step(command)` -> feedback.

Concurrency: one `AlfworldEnv` plays one episode; create one per concurrent episode. Each game
runs in its own copy of fast-downward's shared library (that is how TextWorld isolates games),
so episodes share no game state. But TextWorld's text-grammar parser is a module-level object
and fast-downward's PDDL translator swaps process-wide `sys.argv`/`sys.stdout`, so neither is
thread-safe: a process-wide lock serialises all engine calls (and `sys.argv` is restored after
each translation). `reset` and `step` run in a worker thread, so many episodes interleave in one
asyncio event loop without blocking it; for CPU parallelism use several processes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
from textworld.envs import PddlEnv

from environments.alfworld.games import game_data, goal_text
from environments.alfworld.tasks import check_task_type, make_household

DEFAULT_MAX_STEPS = 50
_ENGINE_LOCK = threading.Lock()


class _EnginePool:
    """TextWorld `PddlEnv`s reused across episodes.

    Each `PddlEnv` loads a private copy of fast-downward's library (~2 MB of memory that is never
    given back: unloading it crashes the process at exit), so episodes borrow one here and
    return it on `close`. The pool grows to the peak number of concurrent episodes. An engine that
    already holds the requested game skips loading it again: repeated episodes of one task (a
    GRPO group) reset faster.
    """

    def __init__(self) -> None:
        self._free: list[tuple[str, PddlEnv]] = []
        self._lock = threading.Lock()

    def acquire(self, game_key: str, infos: textworld.EnvInfos) -> tuple[PddlEnv, bool]:
        """An engine, preferring one that has `game_key` loaded; and whether it has."""
        with self._lock:
            match = next((i for i, (key, _) in enumerate(self._free) if key == game_key), None)
            if match is None and self._free:
                match = len(self._free) - 1
            key, engine = self._free.pop(match) if match is not None else ("", None)
        if engine is None:
            engine = PddlEnv(infos)
        engine.request_infos = infos
        return engine, key == game_key

    def release(self, game_key: str, engine: PddlEnv) -> None:
        with self._lock:
            self._free.append((game_key, engine))


_ENGINES = _EnginePool()


@dataclass(frozen=True)
class Observation:
    """What the agent sees after `reset`.

    Attributes:
        text: The game's opening text (room overview and task), as real ALFWorld prints it.
        goal: The task sentence, e.g. "put a hot apple in fridge".
        admissible_commands: The commands that do something now.
        expert_plan: A shortest command sequence that solves the game, when the env was created
            with `expert_plan=True` (planner output; for oracles and SFT data), else `[]`.
    """

    text: str
    goal: str
    admissible_commands: list[str]
    expert_plan: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StepResult:
    """The outcome of one command.

    Attributes:
        text: The game's feedback ("You open the fridge 1. ...", or "Nothing happens.").
        reward: 1.0 on the step that completes the task, else 0.0.
        done: True when the task is complete or the step budget is spent.
        won: True when the task is complete.
        admissible_commands: The commands that do something now.
        steps: Commands taken so far in this episode.
    """

    text: str
    reward: float
    done: bool
    won: bool
    admissible_commands: list[str]
    steps: int


def reward(result: StepResult) -> float:
    """The episode reward from its last step: 1.0 if the task was completed, else 0.0."""
    return 1.0 if result.won else 0.0


def normalize_command(command: str) -> str:
    """Lower case, single spaces, no trailing period: how the game spells its commands."""
    return " ".join(command.strip().lower().rstrip(".").split())


GAME_FILE_KEYS = ("pddl_domain", "grammar", "pddl_problem")


def check_game_file(path: str | Path) -> str:
    """`path` if it is a readable ALFWorld game (`game.tw-pddl`), else a ValueError naming it.

    Example:
        >>> check_game_file("missing/game.tw-pddl")
        Traceback (most recent call last):
        ...
        ValueError: ALFWorld game file missing/game.tw-pddl does not exist; ...
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(
            f"ALFWorld game file {file} does not exist; check the task's `game_file` (rows from "
            "find_games point into ALFWORLD_DATA)"
        )
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"ALFWorld game file {file} is not a game (JSON with {', '.join(GAME_FILE_KEYS)}): "
            f"{exc}; re-download or re-export it"
        ) from exc
    missing = [key for key in GAME_FILE_KEYS if not isinstance(data, dict) or key not in data]
    if missing:
        raise ValueError(
            f"ALFWorld game file {file} lacks {', '.join(missing)}; it is damaged or not a "
            "game.tw-pddl file; re-download or re-export it"
        )
    return str(file)


def game_for_task(task: dict[str, Any]) -> str | dict[str, Any]:
    """The game of a task row: its `game_file` path, or a game generated from the row.

    Generated rows carry `task_type`, `layout` and `seed` (see `generate.py`); the game is rebuilt
    from them in about a millisecond, so nothing needs caching.
    """
    if task.get("game_file"):
        return check_game_file(task["game_file"])
    for key in ("task_type", "layout", "seed"):
        if key not in task:
            raise ValueError(
                f"ALFWorld task {task.get('id', '?')!r} has neither 'game_file' nor {key!r}; "
                "generated rows need task_type, layout and seed"
            )
    household = make_household(check_task_type(task["task_type"]), task["layout"], task["seed"])
    return game_data(household, goal_text(household, task["seed"]))


class AlfworldEnv:
    """One ALFWorld episode over a task row (a downloaded game or a generated one).

    Args:
        task: A task row: `{"game_file": ...}` or `{"task_type", "layout", "seed"}`.
        max_steps: The step budget; the episode ends (lost) when it is spent.
        expert_plan: Ask the planner for a solution at reset (costs ~0.1-1 s per reset).

    Example:
        >>> import asyncio
        >>> async def play():
        ...     env = AlfworldEnv({"task_type": "pick_and_place_simple",
        ...                        "layout": "bedroom-train-0", "seed": 0}, expert_plan=True)
        ...     observation = await env.reset()
        ...     for command in observation.expert_plan:
        ...         result = await env.step(command)
        ...     env.close()
        ...     return result.won
        >>> asyncio.run(play())
        True
    """

    def __init__(
        self, task: dict[str, Any], max_steps: int = DEFAULT_MAX_STEPS, expert_plan: bool = False
    ) -> None:
        self.task = task
        self.max_steps = max_steps
        self._game = game_for_task(task)
        self._game_key = (
            self._game if isinstance(self._game, str) else json.dumps(self._game["pddl_problem"])
        )
        extras = ["walkthrough"] if expert_plan else []
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=extras)
        self._pddl: PddlEnv | None
        self._pddl, self._loaded = _ENGINES.acquire(self._game_key, infos)
        # alfworld's wrapper names entities as ALFWorld does ("apple 1"); on a reused engine the
        # names are already set, since they live on the engine's entity infos.
        self._env = AlfredDemangler(self._pddl, shuffle=False)
        self._steps = 0
        self._done = True

    def _load(self) -> None:
        try:
            self._env.load(self._game)
        except Exception as exc:
            if not isinstance(self._game, str):
                raise
            # A game file whose PDDL or grammar does not parse: say which file, not just how.
            raise ValueError(
                f"ALFWorld game file {self._game} does not load ({type(exc).__name__}: {exc}); "
                "it is damaged or from another ALFWorld version; re-download or re-export it"
            ) from exc
        self._loaded = True

    def _reset(self) -> Observation:
        if self._pddl is None:
            raise RuntimeError("the env is closed; create a new AlfworldEnv")
        with _ENGINE_LOCK:
            argv = sys.argv
            try:
                if not self._loaded:
                    self._load()
                state = self._env.reset()
            finally:
                sys.argv = argv
        self._steps, self._done = 0, False
        text = state.feedback
        goal = text.split("Your task is to: ", 1)[-1].strip().rstrip(".")
        return Observation(
            text=text,
            goal=goal,
            admissible_commands=list(state["admissible_commands"]),
            expert_plan=list(state.get("extra.walkthrough") or []),
        )

    def _step(self, command: str) -> StepResult:
        if self._done:
            raise RuntimeError("the episode is over; call reset() first")
        with _ENGINE_LOCK:
            state, _, _ = self._env.step(normalize_command(command))
        self._steps += 1
        won = bool(state["won"])
        self._done = won or self._steps >= self.max_steps
        return StepResult(
            text=state.feedback,
            reward=1.0 if won else 0.0,
            done=self._done,
            won=won,
            admissible_commands=list(state["admissible_commands"]),
            steps=self._steps,
        )

    async def reset(self) -> Observation:
        """Starts (or restarts) the episode.

        Returns:
            The opening observation.
        """
        return await asyncio.to_thread(self._reset)

    async def step(self, command: str) -> StepResult:
        """Plays one command (case and a trailing period do not matter).

        A command that is not admissible changes nothing and reads "Nothing happens.", as in
        ALFWorld; it still uses a step.

        Args:
            command: E.g. "go to fridge 1".

        Returns:
            The feedback, reward and whether the episode is over.

        Raises:
            RuntimeError: If the episode is over (won or out of steps) or was never reset.
        """
        return await asyncio.to_thread(self._step, command)

    def close(self) -> None:
        """Ends the episode and returns the game engine to the pool; the env is unusable after."""
        if self._pddl is not None:
            _ENGINES.release(self._game_key if self._loaded else "", self._pddl)
            self._pddl = None
        self._done = True

    def __enter__(self) -> AlfworldEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
