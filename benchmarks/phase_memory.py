"""Where a run's memory peaked, phase by phase, from its metrics.jsonl.

    python benchmarks/phase_memory.py runs/quickstart/metrics.jsonl [more runs...] [--steps]

Each training step logs the process's peak resident memory while each of its phases ran
(`memory/explore_peak_gib`, `memory/train_peak_gib`, `memory/sync_peak_gib`,
`memory/checkpoint_peak_gib`; validation `memory/eval_peak_gib`) and the trainer, under a memory
budget, what its step added and the overshoot it holds back (`train/memory_step_gib`,
`train/memory_overshoot_gib`). This prints, per run, the largest value of each (and with
`--steps` every step's), as a Markdown table for docs/benchmarks.md. The largest of the phase
peaks is the run's peak RSS, what `/usr/bin/time -v` reports (test games run after it are not in
metrics.jsonl).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PHASES = ("explore", "train", "sync", "checkpoint", "eval")
TRAINER = ("train/memory_step_gib", "train/memory_overshoot_gib")


def rows_of(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return [r for r in rows if r.get("phase") != "resume"]


def peaks(rows: list[dict]) -> dict[str, float]:
    """The largest value of every phase peak and trainer measurement in `rows`."""
    out: dict[str, float] = {}
    for row in rows:
        for name in [*(f"memory/{p}_peak_gib" for p in PHASES), *TRAINER]:
            value = row.get(name)
            if isinstance(value, int | float):
                out[name] = max(out.get(name, 0.0), float(value))
    return out


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", nargs="+", type=Path, help="metrics.jsonl files (or run dirs)")
    parser.add_argument("--steps", action="store_true", help="every step's values too")
    args = parser.parse_args()
    names = [*(f"memory/{p}_peak_gib" for p in PHASES), *TRAINER]
    heads = [*(f"{p} peak" for p in PHASES), "trainer step added", "held back"]
    print("| run | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(heads))
    for given in args.metrics:
        path = given / "metrics.jsonl" if given.is_dir() else given
        rows = rows_of(path)
        top = peaks(rows)
        cells = " | ".join(_cell(top.get(n)) for n in names)
        print(f"| {given} (largest) | {cells} |")
        if args.steps:
            for row in rows:
                cells = " | ".join(_cell(row.get(n)) for n in names)
                print(f"| step {row['step']} {row.get('phase', '')} | {cells} |")


if __name__ == "__main__":
    main()
