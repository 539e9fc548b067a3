"""The inventory example's data: a generated stock table and the questions about it.

Every (item, warehouse) pair gets a stock count from a seeded generator; a task asks for one
count. The answer is in the table only, so the agent must call `check_stock`. Items are split
between train, val and test, so the test questions ask about items never asked about in
training (the table itself holds every item: what is learned is the tool, not the numbers). Run

    python examples/inventory/data.py

to (re)write `stock.json` and `tasks_{train,val,test}.jsonl` next to this file; the output is the
same on every run (`--seed` changes it). With `--out DIR`, run the app with
`INVENTORY_STOCK=DIR/stock.json` so that its tool reads the table the tasks were drawn from.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
WAREHOUSES = ("Leeds", "Porto", "Osaka", "Tucson")
MATERIALS = ("steel", "brass", "nylon", "copper", "oak", "rubber", "glass", "cotton")
THINGS = ("bolts", "hinges", "washers", "cables", "brackets", "valves", "gaskets", "springs")
SPLIT_ITEMS = {"train": 40, "val": 12, "test": 12}


def items(rng: random.Random) -> list[str]:
    """Every material-thing pair (64 names), shuffled."""
    names = [f"{m} {t}" for m in MATERIALS for t in THINGS]
    rng.shuffle(names)
    return names


def generate(seed: int = 0) -> tuple[dict[str, dict[str, int]], dict[str, list[dict]]]:
    """The stock table and the tasks of each split (one task per item and warehouse)."""
    rng = random.Random(seed)
    names = items(rng)
    stock = {name: {w: rng.randint(3, 980) for w in WAREHOUSES} for name in sorted(names)}
    splits: dict[str, list[dict]] = {}
    start = 0
    for split, count in SPLIT_ITEMS.items():
        chosen = names[start : start + count]
        start += count
        tasks = [
            {
                "task_id": f"{split}-{i:03d}",
                "question": f"How many {name} are in stock at the {warehouse} warehouse?",
                "item": name,
                "warehouse": warehouse,
                "answer": stock[name][warehouse],
            }
            for i, (name, warehouse) in enumerate(
                (name, warehouse) for name in chosen for warehouse in WAREHOUSES
            )
        ]
        rng.shuffle(tasks)
        splits[split] = tasks
    return stock, splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    stock, splits = generate(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stock.json").write_text(json.dumps(stock, indent=1, sort_keys=True) + "\n")
    for split, tasks in splits.items():
        path = args.out / f"tasks_{split}.jsonl"
        path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
        print(f"{path}: {len(tasks)} tasks")
    if args.out.resolve() != HERE:
        print(f"the app's tool reads {HERE / 'stock.json'}: run with INVENTORY_STOCK=", end="")
        print(args.out.resolve() / "stock.json")


if __name__ == "__main__":
    main()
