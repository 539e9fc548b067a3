"""Scores the scripted and random solvers on a search task set, with index and query timings.

python -m environments.search.evaluate --split test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from environments.search.corpus import load_corpus
from environments.search.env import DATA_DIR, foreign_page, load_tasks
from environments.search.index import SearchIndex
from environments.search.rewards import exact_match, token_f1
from environments.search.solvers import random_solver, scripted_solver
from environments.search.tools import SearchTools


async def evaluate(tasks: list[dict[str, Any]], index: SearchIndex) -> dict[str, Any]:
    """Exact match and F1 of both solvers, overall and per question type; query latency."""
    rng = random.Random(0)
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    latencies: list[float] = []
    for task in tasks:
        for name in ("scripted", "random"):
            tools = SearchTools(index)
            start = time.perf_counter()
            if name == "scripted":
                answer = await scripted_solver(task, tools)
            else:
                answer = await random_solver(task, tools, rng)
            if tools.queries:
                latencies.append((time.perf_counter() - start) / len(tools.queries))
            for group in ("all", str(task.get("type", "unknown"))):
                scores[f"{name}_em"][group].append(exact_match(answer, task["answer"]))
                scores[f"{name}_f1"][group].append(token_f1(answer, task["answer"]))
    summary: dict[str, Any] = {
        metric: {group: round(statistics.mean(values), 4) for group, values in groups.items()}
        for metric, groups in scores.items()
    }
    summary["ms_per_tool_call"] = round(1000 * statistics.mean(latencies), 3)
    return summary


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Baselines on a search task set.")
    parser.add_argument("--split", default="test", help="'train', 'test' or a JSONL path")
    parser.add_argument("--corpus", type=Path, default=DATA_DIR / "corpus.jsonl")
    args = parser.parse_args(argv)
    try:
        documents = load_corpus(args.corpus)
        tasks = load_tasks(args.split)
    except ValueError as error:  # a missing or broken corpus or task file
        parser.exit(2, f"error: {error}\n")
    start = time.perf_counter()
    index = SearchIndex.build(documents)
    build_s = time.perf_counter() - start
    for task in tasks:
        foreign = foreign_page(task, index)
        if foreign is not None:  # another world's questions: every solver would score 0
            parser.exit(
                2,
                f"error: task {task['id']!r} reads page {foreign[0]} ({foreign[1]!r}), which is "
                f"not in {args.corpus}: pass the corpus.jsonl written beside the task file "
                "(--corpus)\n",
            )
    unscripted = next((task for task in tasks if not task.get("program")), None)
    if unscripted is not None:  # your own questions: no solver program to run
        parser.exit(
            2,
            f"error: task {unscripted['id']!r} has no 'program': these baselines (the scripted "
            "oracle, the random solver) run generated questions (environments.search.generate); "
            "measure an agent on your own questions with `agentscope-rft explore --config ... "
            "--set tasks.train=<your file>`\n",
        )
    summary = asyncio.run(evaluate(tasks, index))
    summary |= {"documents": len(documents), "index_build_s": round(build_s, 3)}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
