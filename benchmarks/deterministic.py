"""The cost of `run.deterministic` on the quickstart, and whether two runs repeat.

    python benchmarks/deterministic.py [--steps 3] [--pairs 2]

Runs `agentscope-rft train` on examples/quickstart/config.yaml (embedded SmolLM2-135M, torch
trainer, sync; no evaluation) `--steps` steps, alternating `run.deterministic` off and on,
`--pairs` times each, every run in its own process one after the other (alternating, so load on
the machine falls on both alike). Reported per setting: wall time of the whole run (engine and
trainer start-up included) and mean `time/step`; and, between the first two runs of each
setting, the metrics (every one but wall time, throughput and engine batching counters:
`runtime/deterministic.py:VARYING_METRICS`) that differ and the largest relative difference.
Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from agentscope_rft.runtime.deterministic import repeats  # noqa: E402

QUICKSTART = ROOT / "examples/quickstart/config.yaml"


def run(out: Path, name: str, steps: int, deterministic: bool) -> tuple[float, list[dict]]:
    """One quickstart run; its wall seconds and metric rows (repeating metrics only)."""
    run_dir = out / name
    command = [
        *(sys.executable, "-m", "agentscope_rft.cli", "train", "--config", str(QUICKSTART)),
        *("--set", f"run.dir={run_dir}", "--set", f"run.steps={steps}"),
        *("--set", "run.eval_every=0", "--set", "monitor.tensorboard=false"),
        *("--set", "run.overwrite=true"),
        *("--set", f"run.deterministic={str(deterministic).lower()}"),
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return wall, rows


def differences(a: list[dict], b: list[dict]) -> tuple[list[str], float]:
    """Repeating metrics that differ between two runs, and the largest relative difference."""
    names, largest = set(), 0.0
    for x, y in zip(a, b, strict=True):
        for key in set(x) | set(y):
            if not repeats(key) or x.get(key) == y.get(key):
                continue
            names.add(key)
            u, v = x.get(key), y.get(key)
            if isinstance(u, float | int) and isinstance(v, float | int):
                largest = max(largest, abs(u - v) / max(abs(u), abs(v), 1e-12))
    return sorted(names), largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    walls: dict[bool, list[float]] = {False: [], True: []}
    steps: dict[bool, list[float]] = {False: [], True: []}
    runs: dict[bool, list[list[dict]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="deterministic-") as tmp:
        for pair in range(args.pairs):
            for on in (False, True):
                wall, rows = run(Path(tmp), f"{'on' if on else 'off'}{pair}", args.steps, on)
                walls[on].append(wall)
                steps[on] += [r["time/step"] for r in rows if "time/step" in r]
                runs[on].append(rows)
                print(f"deterministic={on} run {pair}: {wall:.1f} s", file=sys.stderr)
    print(
        "| run.deterministic | wall per run (s) | mean time/step (s) | metrics differing "
        "between two runs | largest relative difference |"
    )
    print("|---|---|---:|---|---:|")
    for on in (False, True):
        names, largest = differences(runs[on][0], runs[on][1]) if args.pairs > 1 else ([], 0.0)
        shown = ", ".join(f"`{n}`" for n in names[:8]) + (" ..." if len(names) > 8 else "")
        print(
            f"| {'on' if on else 'off'} | {', '.join(f'{w:.1f}' for w in walls[on])} | "
            f"{statistics.mean(steps[on]):.2f} | {len(names)} {shown} | {largest:.2g} |"
        )
    ratio = statistics.mean(walls[True]) / statistics.mean(walls[False])
    print(f"\nwall time on / off: {ratio:.3f}x")


if __name__ == "__main__":
    main()
