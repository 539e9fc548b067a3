"""Writes the example's training file: the shipped training questions in curriculum order.

    python examples/web_search/curriculum.py

The run reads tasks in file order (`tasks.shuffle: false`): first `--single` single-hop
questions (one search, copy a fact), then the rest of the single-hop, two-hop and comparison
questions interleaved at random, then the multi-hop ones. The demonstration questions in the
agent's memory are left out.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from environments.jsonl import write_jsonl
from environments.search import load_tasks
from workflows.search_agent import DEMO_TASKS

HERE = Path(__file__).resolve().parent


def curriculum(tasks: list[dict], single: int = 64, seed: int = 0) -> list[dict]:
    """The tasks reordered: easy first, multi-hop last (deterministic for a seed).

    Example:
        >>> rows = [{"id": "a", "type": "multi_hop", "question": "?"},
        ...         {"id": "b", "type": "single_hop", "question": "?"}]
        >>> [r["id"] for r in curriculum(rows, single=1)]
        ['b', 'a']
    """
    rng = random.Random(seed)
    tasks = [t for t in tasks if t["question"] not in DEMO_TASKS]
    by_type = {
        kind: [t for t in tasks if t.get("type") == kind]
        for kind in ("single_hop", "two_hop", "comparison", "multi_hop")
    }
    for rows in by_type.values():
        rng.shuffle(rows)
    first = by_type["single_hop"][:single]
    middle = by_type["single_hop"][single:] + by_type["two_hop"] + by_type["comparison"]
    rng.shuffle(middle)
    return first + middle + by_type["multi_hop"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=64, help="single-hop questions first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "tasks_train.jsonl")
    args = parser.parse_args()
    rows = curriculum(load_tasks("train"), args.single, args.seed)
    print(f"wrote {write_jsonl(args.out, rows)} tasks to {args.out}")


if __name__ == "__main__":
    main()
