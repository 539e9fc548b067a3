"""Write the ALFWorld example's demonstrations: the scripted searcher playing the training games.

The searcher (`workflows/alfworld_scripted.py`) plays each training game through the real app
(`examples/alfworld/app.py`, the real gateway and game engine; only the model is replaced by the
script), and every game it wins becomes one chat-JSONL line: the exact conversation the agent had
with the model, the searcher's commands as the assistant turns. The CPU config trains on these
first (`offline.warmup_steps`), then explores.

    python examples/alfworld/make_demos.py     # -> examples/alfworld/data/demos.jsonl
    python examples/alfworld/make_demos.py --tasks games.jsonl --out demos.jsonl --workflow run
    python examples/alfworld/make_demos.py --replay-in run_window --out data/demos_window.jsonl

Only training games are played: the held-out games never appear in the demonstrations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rich.progress import Progress  # noqa: E402

from agentscope_rft import demos  # noqa: E402
from agentscope_rft.explorer.tasks import load_tasks  # noqa: E402


async def play(
    workflow_name: str,
    tasks: list[Any],
    reply: Any,
    concurrency: int,
    before_each: Any = None,
) -> tuple[list[Any], dict[str, list[Any]]]:
    """Play `tasks` through the app's `workflow_name` with `reply` as the model (real gateway and
    game engine), with a progress bar; `agentscope_rft.demos.play`."""
    with Progress() as progress:
        bar = progress.add_task(f"{workflow_name}: playing games", total=len(tasks))
        return await demos.play(
            f"{ROOT}/examples/alfworld/app.py:{workflow_name}",
            tasks,
            reply,
            concurrency=concurrency,
            max_tokens=16,
            before_each=before_each,
            progress=lambda done, total: progress.update(bar, completed=done),
        )


async def make_demos(args: argparse.Namespace) -> dict[str, Any]:
    from workflows.alfworld_scripted import searcher_reply

    try:
        tasks = load_tasks(args.tasks)
    except ValueError as error:  # a missing or broken task file
        raise SystemExit(f"error: {error}") from None
    if args.limit:
        tasks = tasks[: args.limit]
    started = time.perf_counter()
    rollouts, calls = await play(args.workflow, tasks, searcher_reply, args.concurrency)
    reply = searcher_reply
    if args.replay_in:
        # The searcher needs the whole episode to choose (it avoids receptacles it has visited),
        # so a windowed app cannot be played by it directly. Its won games' commands are replayed
        # there instead, one game at a time: the same commands on the same game give the same
        # observations, and the conversations are what that app shows the model at each turn.
        commands = {
            r.task_id: [searcher_reply(c.messages, c.tools) for c in calls[r.rollout_id]]
            for r in rollouts
            if r.success
        }
        queue: list[str] = []

        def before_each(task: Any) -> None:
            queue[:] = list(commands.get(task.id, []))

        def replay(messages: list[dict[str, Any]], tools: Any = None) -> str:
            return queue.pop(0) if queue else "look"

        won_tasks = [t for t in tasks if t.id in commands]
        rollouts, calls = await play(args.replay_in, won_tasks, replay, 1, before_each)
        reply = _Replayed(calls, rollouts, commands)
    out = Path(args.out)
    written = demos.write_demos(rollouts, calls, reply, out)
    won = sum(r.success for r in rollouts)
    return {
        "games": len(tasks),
        "won": won,
        "conversations": written,
        "commands_per_demo": (
            sum(len(r.calls) for r in rollouts if r.success) / won if won else 0.0
        ),
        "failed": sum(not r.ok for r in rollouts),
        "seconds": round(time.perf_counter() - started, 1),
        "out": str(out),
    }


class _Replayed:
    """`reply` for `conversations` of replayed games: the command each recorded call was given
    (the game's k-th call got its k-th command)."""

    def __init__(
        self, calls: dict[str, list[Any]], rollouts: list[Any], commands: dict[str, list[str]]
    ) -> None:
        self._answers: dict[int, str] = {}
        for rollout in rollouts:
            recorded = calls.get(rollout.rollout_id, [])
            for call, command in zip(recorded, commands[rollout.task_id], strict=False):
                self._answers[id(call.messages)] = command

    def __call__(self, messages: list[dict[str, Any]], tools: Any = None) -> str:
        return self._answers[id(messages)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=str(ROOT / "examples/alfworld/data/train.jsonl"))
    parser.add_argument("--out", default=str(ROOT / "examples/alfworld/data/demos.jsonl"))
    parser.add_argument("--workflow", default="run", help="the app's workflow (app.py name)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N games (0: all)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--replay-in",
        metavar="WORKFLOW",
        help="replay the searcher's won games in another of the app's workflows (e.g. run_window) "
        "and write that workflow's conversations",
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(make_demos(args))))


if __name__ == "__main__":
    main()
