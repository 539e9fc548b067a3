"""Generates ALFWorld task sets over generated households, each checked solvable by the oracle.

    python -m environments.alfworld.generate --train 480 --test 120 --workers 2 \\
        --out environments/alfworld/data

Train and test use disjoint layouts (`room-train-i` vs `room-test-i`), like ALFWorld's unseen
split. Task types are balanced. Each row stores the oracle's plan (`expert_plan`); a task the
oracle cannot finish within the step budget is dropped and replaced (the count is reported).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from environments.alfworld.evaluate import play_all
from environments.alfworld.games import goal_text
from environments.alfworld.household import ROOMS, SIZES
from environments.alfworld.tasks import TASK_ROOMS, TASK_TYPES, check_task_type, make_household
from environments.jsonl import write_jsonl
from environments.progress import progress_bar


def candidates(
    split: str,
    layouts_per_room: int,
    seed: int,
    task_types: tuple[str, ...] = TASK_TYPES,
    sizes: tuple[str, ...] = SIZES,
) -> Iterator[dict[str, Any]]:
    """An endless, deterministic stream of task rows (not yet checked) for one split.

    `task_types` and `sizes` narrow the set (e.g. an easy curriculum stage): each room gets
    `layouts_per_room` layouts of the wanted sizes, and task types take turns.
    """
    for task_type in task_types:
        check_task_type(task_type)
    unknown = sorted(set(sizes) - set(SIZES))
    if unknown or not sizes:
        raise ValueError(f"unknown layout sizes {unknown}; sizes are {', '.join(SIZES)}")
    rng = random.Random(f"alfworld-{split}-{seed}")
    wanted = [i for i in range(3 * layouts_per_room) if SIZES[i % len(SIZES)] in sizes]
    layouts = {room: [f"{room}-{split}-{i}" for i in wanted[:layouts_per_room]] for room in ROOMS}
    index = 0
    while True:
        task_type = task_types[index % len(task_types)]
        layout = rng.choice(layouts[rng.choice(TASK_ROOMS[task_type])])
        task_seed = rng.randrange(1_000_000)
        try:
            household = make_household(task_type, layout, task_seed)
        except ValueError:
            continue  # this layout cannot host this task type (e.g. no lamp); draw again
        index += 1
        yield {
            "task_type": task_type,
            "layout": layout,
            "seed": task_seed,
            "room": household.layout.room,
            "size": household.layout.size,
            "goal": goal_text(household, task_seed),
            "num_receptacles": len(household.layout.receptacles),
            "num_objects": len(household.things),
        }


def generate_split(
    split: str,
    count: int,
    layouts_per_room: int,
    seed: int,
    workers: int,
    task_types: tuple[str, ...] = TASK_TYPES,
    sizes: tuple[str, ...] = SIZES,
) -> tuple[list[dict[str, Any]], int]:
    """`count` oracle-checked rows for a split, and how many candidates the oracle failed."""
    stream = candidates(split, layouts_per_room, seed, task_types, sizes)
    rows: list[dict[str, Any]] = []
    failed = 0
    with progress_bar() as progress:
        bar = progress.add_task(f"{split} games (oracle check)", total=count)
        while len(rows) < count:
            batch = [next(stream) for _ in range(count - len(rows))]
            for row, episode in play_all(batch, "oracle", workers):
                if not episode.won:
                    failed += 1
                    continue
                rows.append(row | {"expert_plan": episode.commands, "expert_steps": episode.steps})
                progress.advance(bar)
    return [{"id": f"alfworld-{split}-{i:05d}", **row} for i, row in enumerate(rows)], failed


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Generate ALFWorld task sets.")
    parser.add_argument("--train", type=int, default=480)
    parser.add_argument("--test", type=int, default=120)
    parser.add_argument("--train-layouts", type=int, default=8, help="layouts per room")
    parser.add_argument("--test-layouts", type=int, default=3, help="layouts per room")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--task-types", default=",".join(TASK_TYPES), help="comma-separated task types"
    )
    parser.add_argument(
        "--sizes", default=",".join(SIZES), help="comma-separated: small,medium,large"
    )
    args = parser.parse_args(argv)
    task_types = tuple(t for t in args.task_types.split(",") if t)
    sizes = tuple(s for s in args.sizes.split(",") if s)
    manifest: dict[str, Any] = {"seed": args.seed, "task_types": task_types, "sizes": sizes}
    for split, count, layouts in (
        ("train", args.train, args.train_layouts),
        ("test", args.test, args.test_layouts),
    ):
        start = time.perf_counter()
        rows, failed = generate_split(
            split, count, layouts, args.seed, args.workers, task_types, sizes
        )
        write_jsonl(args.out / f"{split}.jsonl", rows)
        manifest[split] = {
            "tasks": len(rows),
            "layouts_per_room": layouts,
            "oracle_failures_dropped": failed,
            "seconds": round(time.perf_counter() - start, 1),
            "workers": args.workers,
        }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
