"""Generates FrozenLake task sets: random solvable maps of several sizes from a seed.

    python -m environments.frozenlake.generate --train 1000 --test 200 \\
        --out environments/frozenlake/data

Each row is `{"id", "size", "p_frozen", "seed", "map", "is_slippery", "max_steps",
"shortest_path"}`; test maps never appear in train. The oracle and random success rates on the
written sets are printed and stored in `manifest.json`.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from environments.frozenlake.maps import make_map, shortest_path
from environments.frozenlake.solvers import oracle_episode, random_episode
from environments.jsonl import remove_stale_splits, write_jsonl
from environments.progress import progress_bar

DEFAULT_SIZES = (4, 5, 6, 7, 8)
DEFAULT_P_FROZEN = (0.7, 0.8, 0.9)


def make_tasks(
    split: str,
    count: int,
    seed: int,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    exclude: set[tuple[str, ...]] | None = None,
    is_slippery: bool = False,
) -> list[dict[str, Any]]:
    """`count` distinct task rows (sizes cycle through `sizes`), none with a map in `exclude`.

    Raises:
        ValueError: A negative `count`, or fewer distinct solvable maps of `sizes` than asked
            for (small maps have few: a 2 x 2 lake has 3).

    Example:
        >>> rows = make_tasks("test", 3, seed=0)
        >>> [row["size"] for row in rows]
        [4, 5, 6]
    """
    if count < 0:
        raise ValueError(f"{split}: the number of tasks must be >= 0, got {count}")
    rng = random.Random(f"frozenlake-{split}-{seed}")
    seen = set(exclude or ())
    rows: list[dict[str, Any]] = []
    draws = 0
    while len(rows) < count:
        draws += 1
        if draws > 100 * count + 1000:
            raise ValueError(
                f"{split}: only {len(rows)} of {count} distinct maps of sizes {list(sizes)} found "
                f"in {draws - 1} draws (other splits' maps excluded); ask for fewer tasks or "
                "larger sizes"
            )
        size = sizes[len(rows) % len(sizes)]
        p_frozen = rng.choice(DEFAULT_P_FROZEN)
        map_seed = rng.randrange(2**31)
        desc = make_map(size, p_frozen, map_seed)
        path = shortest_path(desc)
        if path is None:  # gymnasium only returns solvable maps; keep the check honest
            raise RuntimeError(f"unsolvable map from seed {map_seed}: {desc}")
        if tuple(desc) in seen:
            continue
        seen.add(tuple(desc))
        rows.append(
            {
                "id": f"frozenlake-{split}-{len(rows):05d}",
                "size": size,
                "p_frozen": p_frozen,
                "seed": map_seed,
                "map": desc,
                "is_slippery": is_slippery,
                "max_steps": size * size,
                "shortest_path": len(path),
            }
        )
    return rows


def success_rates(rows: list[dict[str, Any]], seed: int = 0) -> dict[str, float]:
    """Oracle and random success rates on task rows."""
    rng = random.Random(f"frozenlake-random-{seed}")
    oracle = sum(oracle_episode(row)[0] for row in rows)
    lucky = sum(random_episode(row, rng)[0] for row in rows)
    return {"oracle": round(oracle / len(rows), 4), "random": round(lucky / len(rows), 4)}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Generate FrozenLake task sets.")
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--slippery", action="store_true", help="slippery ice (stochastic moves)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    manifest: dict[str, Any] = {"seed": args.seed, "sizes": args.sizes, "slippery": args.slippery}
    exclude: set[tuple[str, ...]] = set()
    with progress_bar() as progress:
        bar = progress.add_task("frozenlake splits", total=2)
        for split, count in (("train", args.train), ("test", args.test)):
            start = time.perf_counter()
            sizes = tuple(args.sizes)
            try:
                rows = make_tasks(split, count, args.seed, sizes, exclude, args.slippery)
            except ValueError as error:  # a negative count, too few maps of these sizes
                parser.exit(2, f"error: {error}\n")
            seconds = time.perf_counter() - start
            progress.advance(bar)
            if not rows:  # as the other generators: a split of 0 tasks writes no file
                continue
            exclude |= {tuple(row["map"]) for row in rows}
            write_jsonl(args.out / f"{split}.jsonl", rows)
            manifest[split] = {"tasks": len(rows), "seconds": round(seconds, 3)}
            manifest[split] |= success_rates(rows, args.seed)
    remove_stale_splits(
        args.out, [split for split in ("train", "test") if split in manifest], ("train", "test")
    )
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
