"""The floors a trained ALFWorld policy must beat, per test game: random, scripted searcher, oracle.

    python examples/alfworld/floors.py --workers 2   # -> examples/alfworld/results/floors.json

- `random`: a uniformly random command of those the agent is shown each turn (the admissible
  commands less `help`/`inventory`/`look`; one episode per game, seeded by the game's id).
- `searcher`: the scripted searcher that wrote the demonstrations
  (`workflows/alfworld_scripted.py`), reading the observations exactly as the app's `run` agent
  shows them (`observation_text` with the app's `FULL_SETTINGS`).
- `oracle`: the planner's plan from the game's true state (it sees what the agent cannot: where
  the object is); an upper bound, not a policy to beat.

All three play on the game engine with the app's command budget (`MAX_STEPS` in app.py), in
`--workers` processes (the engine is not thread-safe, so processes, not threads). The file
keeps every game's outcome, so `report.py` breaks the floors down by task type and room beside
a policy.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from environments.alfworld.env import AlfworldEnv  # noqa: E402
from environments.alfworld.evaluate import play as play_reference  # noqa: E402
from environments.alfworld.tasks import load_tasks  # noqa: E402
from workflows.alfworld_agent import observation_text, shown_commands  # noqa: E402
from workflows.alfworld_scripted import searcher_reply  # noqa: E402

POLICIES = ("random", "searcher", "oracle")


@functools.cache
def _app_settings() -> Any:
    """The app's settings, from this folder's app.py (not another `app` imported first)."""
    from agentscope_rft.api import import_file

    return import_file(HERE / "app.py").FULL_SETTINGS


def play_floor(row: dict[str, Any], policy: str) -> bool:
    """Whether `policy` wins the game of `row` within the app's command budget (synchronous, for
    worker processes)."""
    import asyncio

    settings = _app_settings()
    if policy == "oracle":
        return play_reference(row, "oracle", settings.max_steps).won
    if policy not in POLICIES:
        raise ValueError(f"unknown floor policy {policy!r}; choose from {', '.join(POLICIES)}")
    rng = random.Random(f"random-floor-{row['id']}")

    async def episode() -> bool:
        messages: list[dict[str, Any]] = []
        with AlfworldEnv(row, max_steps=settings.max_steps) as env:
            first = await env.reset()
            text, admissible = first.text, first.admissible_commands
            while True:
                current = observation_text(text, admissible, settings)
                messages.append({"role": "user", "content": current})
                if policy == "searcher":
                    command = searcher_reply(messages)
                else:
                    command = rng.choice(shown_commands(admissible, settings) or ["look"])
                messages.append({"role": "assistant", "content": command})
                result = await env.step(command)
                text, admissible = result.text, result.admissible_commands
                if result.done:
                    return result.won

    return asyncio.run(episode())


def outcomes(rows: list[dict[str, Any]], policy: str, workers: int) -> dict[str, bool]:
    """Each game's success for `policy`, in task order."""
    if workers <= 1:
        return {row["id"]: play_floor(row, policy) for row in rows}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        won = pool.map(play_floor, rows, [policy] * len(rows))
        return {row["id"]: result for row, result in zip(rows, won, strict=True)}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=Path, default=HERE / "data" / "test.jsonl")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "floors.json")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    parser.add_argument("--limit", type=int, default=0, help="only the first N games (0: all)")
    parser.add_argument("--workers", type=int, default=1, help="game processes")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    try:
        rows = load_tasks(args.tasks)[: args.limit or None]
    except ValueError as error:  # a missing file, a broken line, a row that is no game
        raise SystemExit(f"error: {error}") from None
    try:
        tasks = str(args.tasks.resolve().relative_to(ROOT))
    except ValueError:
        tasks = str(args.tasks)
    result: dict[str, Any] = {"tasks": tasks, "games": len(rows)}
    result |= {"max_steps": _app_settings().max_steps, "policies": {}, "seconds": {}}
    for policy in policies:
        start = time.perf_counter()
        result["policies"][policy] = outcomes(rows, policy, args.workers)
        result["seconds"][policy] = round(time.perf_counter() - start, 1)
        won = sum(result["policies"][policy].values())
        print(f"{policy}: {won}/{len(rows)} games won ({result['seconds'][policy]} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
