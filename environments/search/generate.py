"""Generates a synthetic encyclopedia and train/validation/test question sets.

    python -m environments.search.generate --pages 2000 --train 1000 --val 200 --test 200 \\
        --reserve "Gastthia Reildebirn" --reserve "Hakar Seicall" --reserve Comwiana \\
        --out environments/search/data

writes `corpus.jsonl`, `train.jsonl`, `val.jsonl`, `test.jsonl` and `manifest.json` (settings
and timings). The splits name disjoint entities and read disjoint facts (`splits.py`); the
reserved pages (the search agent's worked examples) are in no question.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from environments.jsonl import remove_stale_splits, write_jsonl
from environments.progress import progress_bar
from environments.search.corpus import save_corpus
from environments.search.pages import render_pages
from environments.search.splits import SPLITS, check_disjoint, generate_splits
from environments.search.world import build_world


def generate(
    pages: int,
    train: int,
    test: int,
    seed: int,
    out: Path,
    val: int = 0,
    reserve: Sequence[str] = (),
) -> dict[str, object]:
    """Writes a corpus and question sets to `out`; returns the manifest.

    Args:
        pages: Number of corpus pages.
        train: Number of train questions.
        test: Number of test questions.
        seed: The world and question seed.
        out: The output folder.
        val: Number of validation questions (0: no `val.jsonl`; one left in `out` is removed,
            as is any split file of 0 questions).
        reserve: Titles of pages no question names or reads (worked examples).

    Returns:
        The manifest (also written to `out/manifest.json`).

    Example:
        >>> generate(500, 50, 20, seed=0, out=Path("/tmp/search"), val=20)  # doctest: +SKIP
    """
    timings: dict[str, float] = {}
    with progress_bar() as progress:
        stage = progress.add_task("search data", total=5)
        start = time.perf_counter()
        world = build_world(pages, seed)
        timings["world_s"] = time.perf_counter() - start
        progress.advance(stage)
        start = time.perf_counter()
        documents = render_pages(world)
        timings["pages_s"] = time.perf_counter() - start
        progress.advance(stage)
        start = time.perf_counter()
        splits = generate_splits(world, {"train": train, "val": val, "test": test}, seed, reserve)
        shared = check_disjoint(splits)
        if shared:  # generate_splits guarantees this; a failure is a bug, not bad input
            raise AssertionError("; ".join(shared))
        timings["questions_s"] = time.perf_counter() - start
        progress.advance(stage)
        save_corpus(out / "corpus.jsonl", documents)
        progress.advance(stage)
        for split, rows in splits.items():
            write_jsonl(
                out / f"{split}.jsonl",
                ({"id": f"search-{split}-{i:05d}", **row} for i, row in enumerate(rows)),
            )
        remove_stale_splits(out, splits, SPLITS)
        progress.advance(stage)
    manifest = {
        "pages": pages,
        "train": train,
        "val": val,
        "test": test,
        "seed": seed,
        "reserved": list(reserve),
        "timings": {key: round(value, 3) for key, value in timings.items()},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--pages", type=int, default=2000, help="corpus size (100 to 100k+)")
    parser.add_argument("--train", type=int, default=1000, help="train questions")
    parser.add_argument("--val", type=int, default=200, help="validation questions (0: none)")
    parser.add_argument("--test", type=int, default=200, help="test questions")
    parser.add_argument(
        "--reserve", action="append", default=[], help="a page title no question may use"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    try:
        manifest = generate(
            args.pages, args.train, args.test, args.seed, args.out, args.val, args.reserve
        )
    except ValueError as error:  # a world too small, an unknown title: the arguments' fault
        parser.exit(2, f"error: {error}\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
