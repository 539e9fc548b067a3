"""Generates a synthetic encyclopedia and train/test question sets.

    python -m environments.search.generate --pages 2000 --train 1000 --test 200 \\
        --out environments/search/data

writes `corpus.jsonl`, `train.jsonl`, `test.jsonl` and `manifest.json` (settings and timings).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from environments.jsonl import write_jsonl
from environments.progress import progress_bar
from environments.search.corpus import save_corpus
from environments.search.pages import render_pages
from environments.search.questions import generate_questions
from environments.search.world import build_world


def generate(pages: int, train: int, test: int, seed: int, out: Path) -> dict[str, object]:
    """Writes a corpus and question sets to `out`; returns the manifest.

    Args:
        pages: Number of corpus pages.
        train: Number of train questions.
        test: Number of test questions (none of them also in train).
        seed: The world and question seed.
        out: The output folder.

    Returns:
        The manifest (also written to `out/manifest.json`).

    Example:
        >>> generate(500, train=50, test=20, seed=0, out=Path("/tmp/search"))  # doctest: +SKIP
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
        train_rows = generate_questions(world, train, seed=seed * 2 + 1)
        test_rows = generate_questions(
            world, test, seed=seed * 2 + 2, exclude={str(row["question"]) for row in train_rows}
        )
        timings["questions_s"] = time.perf_counter() - start
        progress.advance(stage)
        save_corpus(out / "corpus.jsonl", documents)
        progress.advance(stage)
        for split, rows in (("train", train_rows), ("test", test_rows)):
            write_jsonl(
                out / f"{split}.jsonl",
                ({"id": f"search-{split}-{i:05d}", **row} for i, row in enumerate(rows)),
            )
        progress.advance(stage)
    manifest = {
        "pages": pages,
        "train": train,
        "test": test,
        "seed": seed,
        "timings": {key: round(value, 3) for key, value in timings.items()},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--pages", type=int, default=2000, help="corpus size (100 to 100k+)")
    parser.add_argument("--train", type=int, default=1000, help="train questions")
    parser.add_argument("--test", type=int, default=200, help="test questions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    manifest = generate(args.pages, args.train, args.test, args.seed, args.out)
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
