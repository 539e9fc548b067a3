"""Generates ALFWorld train / validation / test task sets, each game checked solvable by the oracle.

    python -m environments.alfworld.generate --train 480 --val 60 --test 120 --workers 2 \\
        --out environments/alfworld/data

Held-out games are in rooms and goals training never has (`splits.py`): training is drawn first
(layouts `room-train-i`); validation from layouts `room-val-i` whose receptacle set no training
room has, with goals (task type, object, target) no training game has; test likewise from
`room-test-i`, avoiding training's and validation's rooms and goals. Task types are balanced.
Each row stores the oracle's plan (`expert_plan`); a task the oracle cannot finish within the
step budget is dropped and replaced (the count is reported). The draw is a pure function of
the arguments (`--seed`): the same command writes the same files. `--skip-oracle-check` draws
the same candidates without playing them (seconds instead of minutes; no `expert_plan`), for a
quick look at a split's rooms and goals.
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
from environments.alfworld.splits import Seen, goal_key, overlaps, receptacle_set, split_summary
from environments.alfworld.tasks import TASK_ROOMS, TASK_TYPES, check_task_type, make_household
from environments.jsonl import remove_stale_splits, write_jsonl
from environments.progress import progress_bar

SPLITS = ("train", "val", "test")
# Consecutive candidates a split may reject (room or goal already seen, or a task type the
# layout cannot host) before the generator gives up and says why.
MAX_REJECTED = 20_000


def candidates(
    split: str,
    layouts_per_room: int,
    seed: int,
    task_types: tuple[str, ...] = TASK_TYPES,
    sizes: tuple[str, ...] = SIZES,
    avoid: Seen | None = None,
) -> Iterator[dict[str, Any]]:
    """An endless, deterministic stream of task rows (not yet checked) for one split.

    `task_types` and `sizes` narrow the set (e.g. an easy curriculum stage): each room gets
    `layouts_per_room` layouts of the wanted sizes, and task types take turns. With `avoid`,
    layouts whose receptacle set it has seen are left out and a goal it has seen is drawn again.

    Raises:
        ValueError: On an unknown task type or size, or when `avoid` leaves no room for a task
            type or rejects `MAX_REJECTED` candidates in a row (more layouts are needed).
    """
    if not task_types:
        raise ValueError(f"no task types given (--task-types); choose from {', '.join(TASK_TYPES)}")
    for task_type in task_types:
        check_task_type(task_type)
    if not sizes:
        raise ValueError(f"no layout sizes given (--sizes); choose from {', '.join(SIZES)}")
    unknown = sorted(set(sizes) - set(SIZES))
    if unknown:
        raise ValueError(f"unknown layout sizes {unknown}; sizes are {', '.join(SIZES)}")
    rng = random.Random(f"alfworld-{split}-{seed}")
    wanted = [i for i in range(3 * layouts_per_room) if SIZES[i % len(SIZES)] in sizes]
    layouts = {room: [f"{room}-{split}-{i}" for i in wanted[:layouts_per_room]] for room in ROOMS}
    if avoid is not None:
        layouts = {
            room: [name for name in names if not avoid.has_room(name)]
            for room, names in layouts.items()
        }
    rooms = {t: [r for r in TASK_ROOMS[t] if layouts[r]] for t in task_types}
    for task_type, options in rooms.items():
        if not options:
            raise ValueError(
                f"{split}: every {'/'.join(TASK_ROOMS[task_type])} layout of {layouts_per_room} "
                f"per room has the receptacles of a room drawn before, so {task_type} has no "
                f"room; raise the {split} layouts per room (--{split}-layouts)"
            )
    index = 0
    rejected = 0
    while True:
        if rejected >= MAX_REJECTED:
            raise ValueError(
                f"{split}: {MAX_REJECTED} candidates in a row were rejected (their goal was "
                f"drawn before, or the layout cannot host the task); raise --{split}-layouts"
            )
        task_type = task_types[index % len(task_types)]
        layout = rng.choice(layouts[rng.choice(rooms[task_type])])
        task_seed = rng.randrange(1_000_000)
        try:
            household = make_household(task_type, layout, task_seed)
        except ValueError:
            rejected += 1
            continue  # this layout cannot host this task type (e.g. no lamp); draw again
        if avoid is not None and goal_key(household) in avoid.goals:
            rejected += 1
            continue  # a goal an earlier split has: draw again
        index += 1
        rejected = 0
        yield {
            "task_type": task_type,
            "layout": layout,
            "seed": task_seed,
            "room": household.layout.room,
            "size": household.layout.size,
            "goal": goal_text(household, task_seed),
            "num_receptacles": len(household.layout.receptacles),
            "num_objects": len(household.things),
            "receptacle_set": receptacle_set(household.layout),
            "goal_key": goal_key(household),
        }


def generate_split(
    split: str,
    count: int,
    layouts_per_room: int,
    seed: int,
    workers: int,
    task_types: tuple[str, ...] = TASK_TYPES,
    sizes: tuple[str, ...] = SIZES,
    avoid: Seen | None = None,
    oracle_check: bool = True,
) -> tuple[list[dict[str, Any]], int]:
    """`count` rows for a split (oracle-checked unless `oracle_check` is off), and how many
    candidates the oracle failed. `avoid`: the rooms and goals of the splits drawn before."""
    stream = candidates(split, layouts_per_room, seed, task_types, sizes, avoid)
    rows: list[dict[str, Any]] = []
    failed = 0
    if not oracle_check:
        rows = [next(stream) for _ in range(count)]
    else:
        with progress_bar() as progress:
            bar = progress.add_task(f"{split} games (oracle check)", total=count)
            while len(rows) < count:
                batch = [next(stream) for _ in range(count - len(rows))]
                for row, episode in play_all(batch, "oracle", workers):
                    if not episode.won:
                        failed += 1
                        continue
                    plan = {"expert_plan": episode.commands, "expert_steps": episode.steps}
                    rows.append(row | plan)
                    progress.advance(bar)
    return [{"id": f"alfworld-{split}-{i:05d}", **row} for i, row in enumerate(rows)], failed


def generate(
    counts: dict[str, int],
    layouts: dict[str, int],
    seed: int,
    workers: int = 1,
    task_types: tuple[str, ...] = TASK_TYPES,
    sizes: tuple[str, ...] = SIZES,
    oracle_check: bool = True,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The three splits (`SPLITS` order, a split with count 0 left out) and their manifest.

    Each split avoids the rooms and goals of the splits before it; the result is checked with
    `overlaps` before it is returned.

    Raises:
        ValueError: A negative count, from `candidates`, or if the splits overlap (a bug: they
            are drawn apart).

    Example:
        >>> splits, _ = generate({"train": 8, "val": 2, "test": 2}, {"train": 4, "val": 6,
        ...     "test": 6}, seed=1, task_types=("pick_and_place_simple",), sizes=("small",),
        ...     oracle_check=False)
        >>> [len(rows) for rows in splits.values()]
        [8, 2, 2]
    """
    negative = {split: count for split, count in counts.items() if count < 0}
    if negative:
        raise ValueError(f"task counts must be >= 0, got {negative} (--train/--val/--test)")
    manifest: dict[str, Any] = {
        "seed": seed,
        "task_types": task_types,
        "sizes": sizes,
        "oracle_check": oracle_check,
    }
    seen = Seen()
    splits: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        if not counts.get(split):
            continue
        start = time.perf_counter()
        avoid = seen if splits else None
        rows, failed = generate_split(
            split,
            counts[split],
            layouts[split],
            seed,
            workers,
            task_types,
            sizes,
            avoid,
            oracle_check,
        )
        splits[split] = rows
        seen.add(rows)
        manifest[split] = {
            **split_summary(rows),
            "layouts_per_room": layouts[split],
            "oracle_failures_dropped": failed,
            "seconds": round(time.perf_counter() - start, 1),
            "workers": workers,
        }
    problems = overlaps(splits)
    if problems:
        raise ValueError("the generated splits overlap: " + "; ".join(problems[:5]))
    manifest["shared_rooms_or_goals"] = 0
    return splits, manifest


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Generate ALFWorld task sets.")
    parser.add_argument("--train", type=int, default=480)
    parser.add_argument("--val", type=int, default=60)
    parser.add_argument("--test", type=int, default=120)
    parser.add_argument("--train-layouts", type=int, default=8, help="layouts per room")
    parser.add_argument(
        "--val-layouts",
        type=int,
        default=12,
        help="layouts per room to draw from, before those with a training room's receptacles "
        "are left out",
    )
    parser.add_argument(
        "--test-layouts", type=int, default=80, help="as --val-layouts, for the test split"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--task-types", default=",".join(TASK_TYPES), help="comma-separated task types"
    )
    parser.add_argument(
        "--sizes", default=",".join(SIZES), help="comma-separated: small,medium,large"
    )
    parser.add_argument(
        "--skip-oracle-check",
        action="store_true",
        help="write the candidates without playing the oracle on them (fast; no expert_plan)",
    )
    args = parser.parse_args(argv)
    try:
        splits, manifest = generate(
            {"train": args.train, "val": args.val, "test": args.test},
            {"train": args.train_layouts, "val": args.val_layouts, "test": args.test_layouts},
            args.seed,
            args.workers,
            tuple(t for t in args.task_types.split(",") if t),
            tuple(s for s in args.sizes.split(",") if s),
            oracle_check=not args.skip_oracle_check,
        )
    except ValueError as error:  # an unknown task type or size, too few layouts
        parser.exit(2, f"error: {error}\n")
    for split, rows in splits.items():
        write_jsonl(args.out / f"{split}.jsonl", rows)
    remove_stale_splits(args.out, splits, SPLITS)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
