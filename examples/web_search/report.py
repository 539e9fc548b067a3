"""Held-out scores of explored models by question type, next to the oracle and random solvers.

    agentscope-rft explore --config examples/web_search/config.yaml --split eval \\
        --out runs/web_search/explore-untrained
    agentscope-rft explore --config examples/web_search/config.yaml --split eval \\
        --set model.name_or_path=runs/web_search/checkpoints/step-000020/model \\
        --out runs/web_search/explore-trained
    python examples/web_search/report.py untrained=runs/web_search/explore-untrained \\
        trained=runs/web_search/explore-trained

Each folder's `rollouts.jsonl` holds the episodes (their `f1` and `em` metrics); the question
types come from the task file. The scripted oracle and the random solver run on exactly the
questions the explored folders cover.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from environments.search import load_index, load_tasks
from environments.search.evaluate import evaluate

TYPES = ("single_hop", "two_hop", "comparison", "multi_hop")


def explored_scores(folder: Path, types: dict[str, str]) -> dict[str, dict[str, float]]:
    """Mean EM and F1 per question type (and `all`) of an explore folder's episodes.

    A failed or timed-out episode counts as 0 (it answered nothing).
    """
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with open(folder / "rollouts.jsonl", encoding="utf-8") as handle:
        for line in handle:
            rollout = json.loads(line)
            metrics = rollout.get("metrics") or {}
            for group in ("all", types.get(rollout["task_id"], "unknown")):
                for name in ("em", "f1"):
                    scores[name][group].append(float(metrics.get(name, 0.0)))
    return {
        name: {group: statistics.mean(values) for group, values in groups.items()}
        for name, groups in scores.items()
    }


def table(rows: dict[str, dict[str, dict[str, float]]], counts: dict[str, int]) -> str:
    """A markdown table: one row per model or solver, EM, F1 and F1 per question type."""
    head = ["", "EM", "F1", *(f"F1 {t} ({counts.get(t, 0)})" for t in TYPES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, scores in rows.items():
        cells = [name, f"{scores['em']['all']:.3f}", f"{scores['f1']['all']:.3f}"]
        cells += [f"{scores['f1'][t]:.3f}" if t in scores["f1"] else "-" for t in TYPES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="name=explore_folder (e.g. trained=runs/x/out)")
    parser.add_argument("--tasks", default="test", help="'test', 'train' or a task JSONL path")
    args = parser.parse_args(argv)
    tasks = {str(t["id"]): t for t in load_tasks(args.tasks)}
    types = {task_id: str(t.get("type", "unknown")) for task_id, t in tasks.items()}
    rows: dict[str, Any] = {}
    covered: set[str] = set()
    for item in args.runs:
        name, _, folder = item.partition("=")
        rows[name] = explored_scores(Path(folder), types)
        with open(Path(folder) / "rollouts.jsonl", encoding="utf-8") as handle:
            covered |= {json.loads(line)["task_id"] for line in handle}
    subset = [tasks[task_id] for task_id in tasks if task_id in covered]
    solved = asyncio.run(evaluate(subset, load_index()))
    for solver in ("scripted", "random"):
        rows[f"{solver} solver"] = {"em": solved[f"{solver}_em"], "f1": solved[f"{solver}_f1"]}
    counts: dict[str, int] = defaultdict(int)
    for task in subset:
        counts[str(task.get("type", "unknown"))] += 1
    print(f"{len(subset)} questions ({args.tasks})\n")
    print(table(rows, counts))


if __name__ == "__main__":
    main()
