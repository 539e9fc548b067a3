"""Runs the oracle or the random policy over ALFWorld task rows and reports success rates.

python -m environments.alfworld.evaluate --split test --policy random --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from environments.alfworld.env import DEFAULT_MAX_STEPS
from environments.alfworld.solvers import Episode, oracle_episode, random_episode
from environments.alfworld.tasks import load_tasks
from environments.progress import progress_bar


def play(task: dict[str, Any], policy: str, max_steps: int = DEFAULT_MAX_STEPS) -> Episode:
    """One episode of `policy` (`"oracle"` or `"random"`) on a task; synchronous, for workers."""
    if policy == "oracle":
        return asyncio.run(oracle_episode(task, max_steps))
    if policy == "random":
        rng = random.Random(f"random-{task.get('id', '')}")
        return asyncio.run(random_episode(task, rng, max_steps))
    raise ValueError(f"unknown policy {policy!r}; use 'oracle' or 'random'")


def play_all(
    tasks: list[dict[str, Any]], policy: str, workers: int, max_steps: int = DEFAULT_MAX_STEPS
) -> Iterator[tuple[dict[str, Any], Episode]]:
    """Plays every task (in `workers` processes) and yields `(task, episode)` in task order."""
    if workers <= 1:
        for task in tasks:
            yield task, play(task, policy, max_steps)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        episodes = pool.map(play, tasks, [policy] * len(tasks), [max_steps] * len(tasks))
        yield from zip(tasks, episodes, strict=True)


def summarize(results: list[tuple[dict[str, Any], Episode]]) -> dict[str, Any]:
    """Success rate overall and per task type, and mean steps of won episodes."""
    by_type: dict[str, list[bool]] = defaultdict(list)
    for task, episode in results:
        by_type[str(task.get("task_type", "unknown"))].append(episode.won)
    won_steps = [episode.steps for _, episode in results if episode.won]
    return {
        "episodes": len(results),
        "success": round(sum(e.won for _, e in results) / max(1, len(results)), 4),
        "mean_steps_when_won": round(statistics.mean(won_steps), 2) if won_steps else None,
        "success_by_type": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_type.items())},
    }


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Success rate of a reference policy.")
    parser.add_argument("--split", default="test", help="'train', 'test' or a JSONL path")
    parser.add_argument("--policy", choices=("oracle", "random"), default="oracle")
    parser.add_argument("--limit", type=int, default=0, help="first N tasks only (0: all)")
    parser.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the summary JSON here too")
    args = parser.parse_args(argv)
    try:
        tasks = load_tasks(args.split)[: args.limit or None]
    except ValueError as error:  # a missing or broken task file
        parser.exit(2, f"error: {error}\n")
    start = time.perf_counter()
    results = []
    with progress_bar() as progress:
        bar = progress.add_task(f"{args.policy} episodes", total=len(tasks))
        for result in play_all(tasks, args.policy, args.workers, args.max_steps):
            results.append(result)
            progress.advance(bar)
    summary = summarize(results) | {
        "policy": args.policy,
        "split": str(args.split),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
