"""Scores of explored models by question type, next to the trivial floors and the oracles.

    agentscope-rft explore --config examples/web_search/config.yaml --split test \\
        --checkpoint best --out runs/web_search/explore-best
    python examples/web_search/report.py trained=runs/web_search/explore-best
    python examples/web_search/report.py --tasks val          # the floors alone

Each folder's `rollouts.jsonl` holds the episodes (their `f1` and `em` metrics); the question
types come from the task file. A training run's folder works too, with `#STEP` for its greedy
evaluation at that step (`before=runs/web_search#0`), and so does a seed's `test-best` folder of
`agentscope-rft train --seeds ... --test`. The floors (`workflows/search_floors.py`: copy a
question entity, name both, random, the oracle under the shipped tool settings of `app.py` and
unbounded) run on exactly the questions the runs cover. Question types a trivial floor solves, or
that the shipped tools cannot answer, are flagged; the `counted` column averages the others,
which is the only score a learning claim may use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentscope_rft.api import import_file
from environments.search import load_tasks
from environments.search.questions import QUESTION_TYPES
from workflows.search_agent import SearchAgentSettings
from workflows.search_floors import flag_types, floor_scores

HERE = Path(__file__).resolve().parent


def shipped_settings() -> SearchAgentSettings:
    """`app.py`'s `SETTINGS`: the floors' oracle runs under exactly what the example ships."""
    settings: SearchAgentSettings = import_file(HERE / "app.py").SETTINGS
    return settings


def read_rollouts(spec: str) -> list[dict[str, Any]]:
    """The episodes of `folder` (an explore run), or of `folder#STEP` (a training run's
    evaluation at that step)."""
    folder, _, step = spec.partition("#")
    with open(Path(folder) / "rollouts.jsonl", encoding="utf-8") as handle:
        rollouts = [json.loads(line) for line in handle]
    if step:
        rollouts = [r for r in rollouts if r["phase"] in ("eval", "val") and r["step"] == int(step)]
        if not rollouts:
            raise SystemExit(f"{folder} has no evaluation at step {step}")
    return rollouts


def explored_scores(rollouts: list[dict[str, Any]], types: dict[str, str]) -> dict[str, float]:
    """Mean F1 per question type (and `all`) of explored episodes.

    A failed or timed-out episode counts as 0 (it answered nothing).
    """
    scores: dict[str, list[float]] = defaultdict(list)
    for rollout in rollouts:
        metrics = rollout.get("metrics") or {}
        for group in ("all", types.get(rollout["task_id"], "unknown")):
            scores[group].append(float(metrics.get("f1", 0.0)))
    return {group: statistics.mean(values) for group, values in scores.items()}


def counted(scores: dict[str, float], counts: dict[str, int], flags: dict[str, str]) -> float:
    """Mean F1 over the questions of the unflagged types (NaN when none is left)."""
    kept = [t for t in QUESTION_TYPES if counts.get(t) and t not in flags and t in scores]
    total = sum(counts[t] for t in kept)
    return sum(scores[t] * counts[t] for t in kept) / total if total else float("nan")


def table(rows: dict[str, dict[str, float]], counts: dict[str, int], flags: dict[str, str]) -> str:
    """A markdown table: one row per model or floor, F1 overall, per type, and counted."""
    mark = {t: " *" if t in flags else "" for t in QUESTION_TYPES}
    head = ["", "F1", *(f"{t} ({counts.get(t, 0)}){mark[t]}" for t in QUESTION_TYPES)]
    head.append("**counted**")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, scores in rows.items():
        cells = [name, f"{scores['all']:.3f}"]
        cells += [f"{scores[t]:.3f}" if t in scores else "-" for t in QUESTION_TYPES]
        cells.append(f"**{counted(scores, counts, flags):.3f}**")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(runs: list[str], tasks_spec: str) -> dict[str, Any]:
    """The scores of `runs` (`name=folder[#STEP]`) and the floors on the tasks they cover."""
    tasks = {str(t["id"]): t for t in load_tasks(tasks_spec)}
    types = {task_id: str(t.get("type", "unknown")) for task_id, t in tasks.items()}
    rows: dict[str, dict[str, float]] = {}
    covered: set[str] = set()
    for item in runs:
        name, _, spec = item.partition("=")
        if not spec:
            raise SystemExit(f"{item!r}: give a run as name=folder (e.g. trained=runs/x/out)")
        rollouts = read_rollouts(spec)
        rows[name] = explored_scores(rollouts, types)
        covered |= {r["task_id"] for r in rollouts}
    subset = [task for task_id, task in tasks.items() if not runs or task_id in covered]
    floors = asyncio.run(floor_scores(subset, shipped_settings()))
    rows |= floors
    counts: dict[str, int] = defaultdict(int)
    for task in subset:
        counts[str(task.get("type", "unknown"))] += 1
    flags = flag_types(floors)
    return {"tasks": tasks_spec, "counts": dict(counts), "flags": flags, "scores": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="name=explore_folder (e.g. trained=runs/x/out)")
    parser.add_argument("--tasks", default="test", help="'test', 'val', 'train' or a JSONL path")
    parser.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    result = report(args.runs, args.tasks)
    counts, flags = result["counts"], result["flags"]
    print(f"{sum(counts.values())} questions ({args.tasks}); F1 of the agent's reward\n")
    print(table(result["scores"], counts, flags))
    print()
    for question_type, why in flags.items():
        print(f"* {question_type}: not counted ({why})")
    kept = [t for t in QUESTION_TYPES if counts.get(t) and t not in flags]
    print(f"counted: {', '.join(kept) or 'none'} ({sum(counts[t] for t in kept)} questions)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
