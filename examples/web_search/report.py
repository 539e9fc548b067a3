"""Scores of explored models by question type, next to the trivial floors and the oracles.

    agentscope-rft explore --config examples/web_search/config.yaml --split test \\
        --checkpoint best --out runs/web_search/explore-best
    python examples/web_search/report.py trained=runs/web_search/explore-best
    python examples/web_search/report.py --tasks val          # the floors alone
    python examples/web_search/report.py untrained=... seed0=... control0=... \
        --baseline untrained --group rl=seed --group control=control --compare seed0:control0

`--baseline` prints each run's counted F1 minus the baseline's; `--group LABEL=PREFIX` the mean,
std, min and max of the runs whose names start with PREFIX (a seed table); `--compare A:B` the
difference A - B in counted F1 with a 95% paired bootstrap interval over the counted questions
both answered (the same test questions, resampled together); `--compare A1,A2:B1,B2` the same
over several seeds paired in order (each question's F1 averaged over the seeds of each side).

Each folder's `rollouts.jsonl` holds the episodes (their `f1` and `em` metrics); the question
types come from the task file. A training run's folder works too, with `#STEP` for its greedy
evaluation at that step (`before=runs/web_search#0`), and so does a seed's `test-best` folder of
`agentscope-rft train --seeds ... --test`. An earlier report's JSON with `#NAME` gives that run's
per-question F1 (`seed0=examples/web_search/results/rl/seeds_test.json#seed0`), so a committed
arm can be compared with a new one after its run folders are gone. The floors
(`workflows/search_floors.py`: copy a question entity, name both, random, the oracle under the
shipped tool settings of `app.py` and unbounded) run on exactly the questions the runs cover.
Question types a trivial floor solves, or that the shipped tools cannot answer, are flagged; the
`counted` column averages the others, which is the only score a learning claim may use.
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
    evaluation at that step), or `report.json#NAME`: run NAME's per-question F1 from an earlier
    `--json` report (one episode per question, its mean F1), for runs whose folders are gone."""
    folder, _, step = spec.partition("#")
    if folder.endswith(".json"):
        return _reported_rollouts(Path(folder), step)
    with open(Path(folder) / "rollouts.jsonl", encoding="utf-8") as handle:
        rollouts = [json.loads(line) for line in handle]
    if step:
        rollouts = [r for r in rollouts if r["phase"] in ("eval", "val") and r["step"] == int(step)]
        if not rollouts:
            raise SystemExit(f"{folder} has no evaluation at step {step}")
    return rollouts


def _reported_rollouts(path: Path, name: str) -> list[dict[str, Any]]:
    """One pseudo-episode per question with run `name`'s F1 in the report `path`."""
    try:
        per_question = json.loads(path.read_text(encoding="utf-8"))["per_question"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"{path}: not a report with per-question F1 ({exc!r}); give a JSON written by "
            "report.py --json with named runs"
        ) from exc
    if name not in per_question:
        raise SystemExit(f"{path}#{name}: no run {name!r} there; it has {sorted(per_question)}")
    return [{"task_id": q, "metrics": {"f1": f1}} for q, f1 in per_question[name].items()]


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


def question_f1(rollouts: list[dict[str, Any]]) -> dict[str, float]:
    """Mean F1 of each question's episodes (a failed or timed-out episode counts as 0)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for rollout in rollouts:
        by_task[rollout["task_id"]].append(float((rollout.get("metrics") or {}).get("f1", 0.0)))
    return {task_id: statistics.mean(values) for task_id, values in by_task.items()}


def paired_difference(
    a: dict[str, float], b: dict[str, float], questions: set[str], samples: int = 10_000
) -> dict[str, float]:
    """Mean of a - b over `questions` both answered, with a 95% paired bootstrap interval
    (questions resampled with replacement, the same draw for both; seeded, so it repeats).

    Example:
        >>> d = paired_difference({"q1": 1.0, "q2": 0.5}, {"q1": 0.0, "q2": 0.5}, {"q1", "q2"})
        >>> d["diff"], d["questions"]
        (0.5, 2)
    """
    import random

    shared = sorted(questions & a.keys() & b.keys())
    if not shared:
        return {"diff": float("nan"), "low": float("nan"), "high": float("nan"), "questions": 0}
    diffs = [a[q] - b[q] for q in shared]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(samples))
    return {
        "diff": statistics.fmean(diffs),
        "low": means[int(0.025 * samples)],
        "high": means[int(0.975 * samples) - 1],
        "questions": len(shared),
    }


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
    per_question: dict[str, dict[str, float]] = {}
    covered: set[str] = set()
    for item in runs:
        name, _, spec = item.partition("=")
        if not spec:
            raise SystemExit(f"{item!r}: give a run as name=folder (e.g. trained=runs/x/out)")
        rollouts = read_rollouts(spec)
        rows[name] = explored_scores(rollouts, types)
        per_question[name] = question_f1(rollouts)
        covered |= {r["task_id"] for r in rollouts}
    subset = [task for task_id, task in tasks.items() if not runs or task_id in covered]
    if not subset:
        raise SystemExit(
            f"the runs answered none of the {len(tasks)} questions of {tasks_spec}: give "
            "--tasks the task file they explored (explore --split test: --tasks test)"
        )
    try:
        floors = asyncio.run(floor_scores(subset, shipped_settings()))
    except ValueError as error:  # tasks of another world than the corpus searched
        raise SystemExit(f"error: {error}") from None
    rows |= floors
    counts: dict[str, int] = defaultdict(int)
    for task in subset:
        counts[str(task.get("type", "unknown"))] += 1
    flags = flag_types(floors)
    counted_questions = {
        task_id for task_id, kind in types.items() if kind not in flags and task_id in covered
    }
    result: dict[str, Any] = {
        "tasks": tasks_spec,
        "counts": dict(counts),
        "flags": flags,
        "scores": rows,
    }
    if runs:  # each question's F1 per run, for paired comparisons
        result["per_question"] = per_question
        result["counted_questions"] = sorted(counted_questions)
    return result


def comparisons(
    result: dict[str, Any], baseline: str | None, groups: list[str], pairs: list[str]
) -> dict[str, Any]:
    """The seed-table numbers: gains over `baseline`, group statistics, paired differences."""
    counts, flags, scores = result["counts"], result["flags"], result["scores"]
    value = {name: counted(scores[name], counts, flags) for name in result["per_question"]}
    out: dict[str, Any] = {"counted": value}
    if baseline is not None:
        if baseline not in value:
            raise SystemExit(f"--baseline {baseline!r} is not one of the runs: {sorted(value)}")
        out["gain"] = {n: v - value[baseline] for n, v in value.items() if n != baseline}
    out["groups"] = {}
    for spec in groups:
        label, _, prefix = spec.partition("=")
        members = [n for n in value if n.startswith(prefix or label)]
        if not members:
            raise SystemExit(f"--group {spec!r} matches no run: {sorted(value)}")
        values = [value[n] for n in members]
        stats = {
            "runs": members,
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values),
            "max": max(values),
        }
        if baseline is not None:
            stats["min_gain"] = min(values) - value[baseline]
            stats["mean_gain"] = stats["mean"] - value[baseline]
        out["groups"][label] = stats
    out["pairs"] = {}
    questions = set(result["counted_questions"])
    for spec in pairs:
        left, sep, right = spec.partition(":")
        firsts, seconds = left.split(","), right.split(",")
        names = firsts + seconds
        if not sep or len(firsts) != len(seconds) or any(n not in value for n in names):
            raise SystemExit(
                f"--compare {spec!r}: give A:B of two runs, or A1,A2:B1,B2 of equally many "
                f"(paired in order), from {sorted(value)}"
            )
        per = result["per_question"]
        out["pairs"][spec] = paired_difference(
            _mean_per_question([per[n] for n in firsts]),
            _mean_per_question([per[n] for n in seconds]),
            questions,
        )
    return out


def _mean_per_question(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each question's F1 averaged over `runs` (the questions all of them answered): several
    seeds compared as one arm, so the bootstrap resamples questions with every seed's answer.

    Example:
        >>> _mean_per_question([{"q1": 1.0, "q2": 0.0}, {"q1": 0.5}])
        {'q1': 0.75}
    """
    shared = set.intersection(*(set(run) for run in runs))
    return {q: statistics.fmean(run[q] for run in runs) for q in sorted(shared)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="name=explore_folder (e.g. trained=runs/x/out)")
    parser.add_argument("--tasks", default="test", help="'test', 'val', 'train' or a JSONL path")
    parser.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    parser.add_argument("--baseline", help="a run's name: print every run's gain over it")
    parser.add_argument(
        "--group", action="append", default=[], help="LABEL=PREFIX: seed-table statistics"
    )
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        help="A:B (or A1,A2:B1,B2, seeds paired in order): paired difference in counted F1",
    )
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
    if args.baseline or args.group or args.compare:
        result["comparisons"] = comparisons(result, args.baseline, args.group, args.compare)
        print_comparisons(result["comparisons"], args.baseline)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def print_comparisons(out: dict[str, Any], baseline: str | None) -> None:
    for name, gain in out.get("gain", {}).items():
        print(f"{name}: counted F1 {out['counted'][name]:.3f} ({gain:+.3f} over {baseline})")
    for label, g in out["groups"].items():
        line = (
            f"{label} ({len(g['runs'])} runs): counted F1 {g['mean']:.3f} ± {g['std']:.3f} "
            f"(min {g['min']:.3f}, max {g['max']:.3f})"
        )
        if "min_gain" in g:
            line += f"; gain over {baseline}: mean {g['mean_gain']:+.3f}, min {g['min_gain']:+.3f}"
        print(line)
    for spec, d in out["pairs"].items():
        print(
            f"{spec}: {d['diff']:+.3f} counted F1 [95% paired bootstrap {d['low']:+.3f}, "
            f"{d['high']:+.3f}] over {d['questions']} questions"
        )


if __name__ == "__main__":
    main()
