"""Arithmetic questions for the quickstart, generated deterministically from a seed.

Each task asks for one product, sum or difference whose answer the 135M model cannot produce by
guessing (two- and three-digit operands), but can get with the `calculate` tool. Run

    python examples/quickstart/task.py

to (re)write `tasks_train.jsonl`, `tasks_val.jsonl` and `tasks_test.jsonl` next to this file.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (operator, range of the first operand, range of the second): big enough that the model cannot
# guess the answer, small enough that a tool call and its result stay a few tokens long.
OPERATIONS: list[tuple[str, tuple[int, int], tuple[int, int]]] = [
    ("*", (12, 99), (12, 99)),
    ("+", (100, 999), (100, 999)),
    ("-", (500, 999), (100, 499)),
]


def make_task(rng: random.Random, index: int, split: str) -> dict:
    op, (a_lo, a_hi), (b_lo, b_hi) = OPERATIONS[rng.randrange(len(OPERATIONS))]
    a, b = rng.randint(a_lo, a_hi), rng.randint(b_lo, b_hi)
    answer = {"*": a * b, "+": a + b, "-": a - b}[op]
    return {
        "task_id": f"{split}-{index:04d}",
        "question": f"What is {a} {op} {b}?",
        "answer": answer,
    }


def generate(
    n_train: int = 512, n_test: int = 128, seed: int = 0, n_val: int = 0
) -> tuple[list[dict], ...]:
    """Train and test tasks (and validation tasks when `n_val`); no question is in two splits.
    The validation split is drawn last, so adding it leaves train and test as they were.

    Example:
        >>> train, test = generate(8, 4, seed=0)
        >>> len(train), len(test), {t["question"] for t in train} & {t["question"] for t in test}
        (8, 4, set())
        >>> len(generate(8, 4, seed=0, n_val=3)[2])
        3
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict]] = {"train": [], "test": [], "val": []}
    for split, count in (("train", n_train), ("test", n_test), ("val", n_val)):
        while len(splits[split]) < count:
            task = make_task(rng, len(splits[split]), split)
            if task["question"] not in seen:
                seen.add(task["question"])
                splits[split].append(task)
    if n_val:
        return splits["train"], splits["test"], splits["val"]
    return splits["train"], splits["test"]


def write_jsonl(path: Path, tasks: list[dict]) -> None:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))


def load_tasks(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=512)
    parser.add_argument("--n-test", type=int, default=128)
    parser.add_argument("--n-val", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=HERE)
    args = parser.parse_args()
    train, test, val = generate(args.n_train, args.n_test, args.seed, n_val=args.n_val)
    write_jsonl(args.out_dir / "tasks_train.jsonl", train)
    write_jsonl(args.out_dir / "tasks_test.jsonl", test)
    write_jsonl(args.out_dir / "tasks_val.jsonl", val)
    print(
        f"wrote {len(train)} train, {len(val)} validation and {len(test)} test tasks to "
        f"{args.out_dir}"
    )


if __name__ == "__main__":
    main()
