"""The ALFWorld example's test report: success with 95% intervals, per task type and room, beside
the floors, and the RL-vs-control difference per seed.

    python examples/alfworld/report.py --arm rl=runs/alfworld \\
        --arm control=runs/alfworld_sft_control
    python examples/alfworld/report.py --arm step16=runs/alfworld-eval-16 --out report.md

An arm is a folder: a seed sweep (`train --seeds ... --test`: each `seed-<k>/test-best/`), one
run (its `test-best/`), or an `explore` output folder; the report reads each one's
`results.jsonl` (one line per test game). The floors come from `floors.py`'s file.

- **Success** is the share of test games won (a game's `success_rate` when it was played more
  than once), with a 95% **Wilson score interval** over the games.
- **Differences** between the first arm and each other (same seed, same games) come with a 95%
  **paired bootstrap** interval: the test games are resampled with replacement (10,000 times,
  numpy's default generator, fixed seed), each resample's difference of success rates taken,
  and the 2.5th and 97.5th percentiles reported. "All seeds" resamples games over the per-game
  success averaged across the seeds both arms have.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
Z95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 10_000
MIN_TEST_GAMES = 100  # the bar for a claim on the test games

Outcomes = dict[str, float]  # task id -> success (0..1)


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95% by default).

    Example:
        >>> [round(x, 3) for x in wilson(47, 100)]
        [0.375, 0.567]
        >>> wilson(0, 0)
        (0.0, 1.0)
    """
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def paired_bootstrap(
    first: Sequence[float],
    second: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean difference first - second, 2.5th percentile, 97.5th percentile) over games resampled
    with replacement; `first[i]` and `second[i]` are the same game.

    Example:
        >>> diff, low, high = paired_bootstrap([1, 1, 0, 1] * 25, [0, 1, 0, 0] * 25)
        >>> round(diff, 2), low > 0.3, high < 0.7
        (0.5, True, True)
    """
    if len(first) != len(second) or not first:
        raise ValueError("paired_bootstrap needs two equally long, non-empty lists of games")
    differences = np.asarray(first, dtype=float) - np.asarray(second, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(differences), (resamples, len(differences)))
    draws = np.sort(differences[picks].mean(axis=1))
    low = float(draws[int(0.025 * (resamples - 1))])
    high = float(draws[math.ceil(0.975 * (resamples - 1))])
    return float(differences.mean()), low, high


def read_results(path: Path) -> Outcomes:
    """Each game's success from an explore `results.jsonl`."""
    outcomes: Outcomes = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            outcomes[str(row["task_id"])] = float(row["success_rate"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SystemExit(f"{path}:{number}: not an explore result line ({exc})") from exc
    if not outcomes:
        raise SystemExit(f"{path} has no results: was the evaluation finished?")
    return outcomes


def read_arm(folder: Path) -> dict[str, Outcomes]:
    """An arm's outcomes per seed (`"0"`, `"1"`, ...; `"-"` for a single run or explore folder).

    Raises:
        SystemExit: If the folder holds no test results, naming what was looked for.
    """
    sweep = folder / "sweep.json"
    if sweep.is_file():
        runs = json.loads(sweep.read_text()).get("runs", {})
        found = {
            seed: read_results(folder / name / "test-best" / "results.jsonl")
            for seed, name in sorted(runs.items(), key=lambda item: int(item[0]))
            if (folder / name / "test-best" / "results.jsonl").is_file()
        }
        if not found:
            raise SystemExit(
                f"{folder}: no seed has test results (seed-<k>/test-best/results.jsonl); run "
                f"`agentscope-rft sweep-summary {folder} --test`"
            )
        return found
    for candidate in (folder / "test-best" / "results.jsonl", folder / "results.jsonl"):
        if candidate.is_file():
            return {"-": read_results(candidate)}
    raise SystemExit(
        f"{folder}: no sweep.json, test-best/results.jsonl or results.jsonl; pass a sweep folder "
        "(train --seeds ... --test), a run folder with test-best/, or an explore folder"
    )


def read_floors(path: Path) -> dict[str, Outcomes]:
    """The floors' outcomes per policy from `floors.py`'s file (wins as 1.0, losses as 0.0)."""
    if not path.is_file():
        raise SystemExit(f"{path} does not exist; write it with `python {HERE / 'floors.py'}`")
    data = json.loads(path.read_text())
    return {
        policy: {task: float(won) for task, won in games.items()}
        for policy, games in data["policies"].items()
    }


def _cell(outcomes: Sequence[float]) -> str:
    n = len(outcomes)
    if not n:
        return "–"
    won = sum(outcomes)
    low, high = wilson(won, n)
    return f"{won / n:.2f} [{low:.2f}, {high:.2f}]"


def _paired_seeds(
    first: Mapping[str, Outcomes], second: Mapping[str, Outcomes]
) -> tuple[Mapping[str, Outcomes], Mapping[str, Outcomes]]:
    """The two arms keyed by the seeds they are compared on: the same seeds, or, where one arm
    is a single run (`"-"`, e.g. the untrained model every seed starts from), each seed of the
    other against that run.

    Example:
        >>> _paired_seeds({"-": {"g": 0.0}}, {"0": {"g": 1.0}, "1": {"g": 0.0}})[0]
        {'0': {'g': 0.0}, '1': {'g': 0.0}}
    """
    if set(first) == {"-"} and "-" not in second:
        return {seed: first["-"] for seed in second}, second
    if set(second) == {"-"} and "-" not in first:
        return first, {seed: second["-"] for seed in first}
    return first, second


def report(
    tasks: list[dict[str, Any]],
    floors: Mapping[str, Outcomes],
    arms: Mapping[str, Mapping[str, Outcomes]],
) -> tuple[str, dict[str, Any]]:
    """The report as markdown, and the same numbers as a dict."""
    by_id = {str(t["id"]): t for t in tasks}
    policies: dict[str, Outcomes] = {f"floor: {name}": o for name, o in floors.items()}
    for arm, seeds in arms.items():
        for seed, outcomes in seeds.items():
            policies[arm if seed == "-" else f"{arm} seed {seed}"] = outcomes
    for name, outcomes in policies.items():
        unknown = sorted(set(outcomes) - set(by_id))
        if unknown:
            raise SystemExit(
                f"{name}: {len(unknown)} games are not in the tasks file (e.g. {unknown[0]}); "
                "pass the test file the results were made on (--tasks)"
            )
    types = sorted({str(t.get("task_type", "?")) for t in tasks})
    rooms = sorted({str(t.get("room", "?")) for t in tasks})
    data: dict[str, Any] = {"games": len(tasks), "policies": {}, "differences": []}
    lines = [
        f"Test games: {len(tasks)}. Success with its 95% Wilson interval over the games.",
        "",
    ]
    if len(tasks) < MIN_TEST_GAMES:
        lines += [f"**Fewer than {MIN_TEST_GAMES} test games: not enough for a claim.**", ""]
    head = ["policy", "games", "success [95% CI]"]
    head += [f"type: {t}" for t in types]
    head += [f"room: {r}" for r in rooms]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name, outcomes in policies.items():
        values = list(outcomes.values())
        row = [name, str(len(values)), _cell(values)]
        groups: dict[str, list[float]] = defaultdict(list)
        for task, value in outcomes.items():
            groups["type:" + str(by_id[task].get("task_type", "?"))].append(value)
            groups["room:" + str(by_id[task].get("room", "?"))].append(value)
        row += [_cell(groups["type:" + t]) for t in types]
        row += [_cell(groups["room:" + r]) for r in rooms]
        lines.append("| " + " | ".join(row) + " |")
        low, high = wilson(sum(values), len(values))
        data["policies"][name] = {
            "games": len(values),
            "success": sum(values) / len(values),
            "ci95": [low, high],
            "by_group": {k: sum(v) / len(v) for k, v in sorted(groups.items())},
        }
    for arm, seeds in arms.items():
        rates = [sum(o.values()) / len(o) for o in seeds.values()]
        if len(rates) > 1:
            std = statistics.stdev(rates)
            lines += ["", f"{arm}: mean over {len(rates)} seeds {statistics.mean(rates):.3f}"]
            lines[-1] += f" ± {std:.3f} (sample std)"
    names = list(arms)
    if len(names) > 1:
        base = names[0]
        lines += [
            "",
            "Differences in success (first arm minus the other), same games, with the 95% paired "
            "bootstrap interval over games:",
            "",
            "| comparison | seed | games | difference [95% CI] |",
            "|---|---|---|---|",
        ]
        for other in names[1:]:
            left, right = _paired_seeds(arms[base], arms[other])
            shared = [s for s in left if s in right]
            per_game: dict[str, list[tuple[float, float]]] = defaultdict(list)
            for seed in shared:
                games = sorted(set(left[seed]) & set(right[seed]))
                first = [left[seed][g] for g in games]
                second = [right[seed][g] for g in games]
                for game, a, b in zip(games, first, second, strict=True):
                    per_game[game].append((a, b))
                diff, low, high = paired_bootstrap(first, second)
                lines.append(
                    f"| {base} - {other} | {seed} | {len(games)} | "
                    f"{diff:+.3f} [{low:+.3f}, {high:+.3f}] |"
                )
                data["differences"].append(
                    {"first": base, "second": other, "seed": seed, "games": len(games)}
                    | {"difference": diff, "ci95": [low, high]}
                )
            if len(shared) > 1:
                complete = [g for g, pairs in per_game.items() if len(pairs) == len(shared)]
                first = [statistics.mean(a for a, _ in per_game[g]) for g in complete]
                second = [statistics.mean(b for _, b in per_game[g]) for g in complete]
                diff, low, high = paired_bootstrap(first, second)
                lines.append(
                    f"| {base} - {other} | all {len(shared)} | {len(complete)} | "
                    f"{diff:+.3f} [{low:+.3f}, {high:+.3f}] |"
                )
                data["differences"].append(
                    {"first": base, "second": other, "seed": "all", "games": len(complete)}
                    | {"difference": diff, "ci95": [low, high]}
                )
            if not shared:
                lines.append(f"| {base} - {other} | – | – | no seed in common |")
    return "\n".join(lines) + "\n", data


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="a sweep, run or explore folder with test results (repeatable; the first is the "
        "one the others are compared with)",
    )
    parser.add_argument("--tasks", type=Path, default=HERE / "data" / "test.jsonl")
    parser.add_argument("--floors", type=Path, default=HERE / "results" / "floors.json")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    arms: dict[str, dict[str, Outcomes]] = {}
    for item in args.arm:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"--arm {item!r}: write NAME=FOLDER, e.g. rl=runs/alfworld")
        arms[name] = read_arm(Path(folder))
    tasks = [json.loads(line) for line in args.tasks.read_text().splitlines() if line.strip()]
    markdown, data = report(tasks, read_floors(args.floors), arms)
    sys.stdout.write(markdown)
    if args.out:
        args.out.write_text(markdown)
    if args.json:
        args.json.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
