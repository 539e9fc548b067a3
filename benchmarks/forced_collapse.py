"""A forced collapse: the quickstart at a learning rate high enough that the policy's entropy
collapses, with the health rules watching only vs rolling back, per seed.

For each seed it runs the quickstart twice (one after the other) with `trainer.lr` raised:
`watch` (the entropy rule only warns: the run goes on collapsed) and `rollback` (the rule rolls
back to the last healthy checkpoint and continues at `lr x lr_factor`). It reports the step the
rule fired at, the rollbacks, and the validation reward (greedy, `tasks.val`) at the best
checkpoint and at the last step, and writes a JSON file and a markdown table.

    python benchmarks/forced_collapse.py --seeds 0,1,2 --lr 1e-3 --steps 12 --out /tmp/collapse

Each run is `agentscope-rft train --config examples/quickstart/config.yaml` with `--set`
overrides (printed), so any one can be re-made by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "quickstart" / "config.yaml"


def overrides(
    variant: str,
    seed: int,
    lr: float,
    steps: int,
    eval_every: int,
    run_dir: Path,
    val_limit: int,
) -> list[str]:
    action = "rollback" if variant == "rollback" else "warn"
    return [
        f"run.dir={run_dir}",
        f"run.seed={seed}",
        f"explorer.seed={seed}",
        f"trainer.lr={lr}",
        f"run.steps={steps}",
        f"run.eval_every={eval_every}",
        "run.checkpoint_every=1",
        "run.keep_checkpoints=2",
        f"tasks.val_limit={val_limit}",
        "monitor.console=false",
        f"health.rules.entropy_collapse.action={action}",
        "health.rollback.lr_factor=0.1",
        "health.rollback.max_rollbacks=2",
    ]


def run_one(variant: str, seed: int, args: argparse.Namespace) -> dict:
    run_dir = args.out / f"{variant}-seed{seed}"
    sets = overrides(variant, seed, args.lr, args.steps, args.eval_every, run_dir, args.val_limit)
    command = [sys.executable, "-m", "agentscope_rft.cli", "train", "--config", str(CONFIG)]
    for item in sets:
        command += ["--set", item]
    print("$", " ".join(command), flush=True)
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (args.out / f"{variant}-seed{seed}.log").write_text(proc.stdout + proc.stderr)
    return summarize(run_dir, variant, seed, proc.returncode, seconds)


def summarize(run_dir: Path, variant: str, seed: int, returncode: int, seconds: float) -> dict:
    from agentscope_rft.health import read_events
    from agentscope_rft.monitor.records import (
        MetricsFileError,
        per_step,
        read_metrics,
        surviving_history,
    )
    from agentscope_rft.runtime.best import read_best

    error = None
    try:
        records = surviving_history(read_metrics(run_dir / "metrics.jsonl"))
    except MetricsFileError as exc:  # the run died before its first step (see its .log)
        records, error = [], str(exc)
    val = [(r.step, r.metrics.get("reward/mean")) for r in per_step(records, "val")]
    train = per_step(records, "train")
    events = [e for e in read_events(run_dir) if e.rule == "entropy_collapse"]
    best = read_best(run_dir)
    row = {
        "variant": variant,
        "seed": seed,
        "returncode": returncode,
        "minutes": round(seconds / 60, 1),
        "detected_at_step": events[0].step if events else None,
        "onset_step": events[0].onset if events else None,
        "rollbacks": sum(e.rolled_back_to is not None for e in events),
        "val_curve": val,
        "val_best": best["value"] if best else None,
        "best_step": best["step"] if best else None,
        "val_last": val[-1][1] if val else None,
        "entropy": [round(r.metrics.get("entropy/mean", float("nan")), 3) for r in train],
    }
    if error is not None:  # never kept as done: a re-run makes it again
        row |= {"returncode": returncode or 1, "error": error}
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| variant | seed | fired at step (onset) | rollbacks | val reward at best (step) | "
        "val reward last | minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fired = (
            "-" if r["detected_at_step"] is None else f"{r['detected_at_step']} ({r['onset_step']})"
        )
        best = "-" if r["val_best"] is None else f"{r['val_best']:.3f} ({r['best_step']})"
        last = "-" if r["val_last"] is None else f"{r['val_last']:.3f}"
        lines.append(
            f"| {r['variant']} | {r['seed']} | {fired} | {r['rollbacks']} | {best} | {last} | "
            f"{r['minutes']} |"
        )
    for variant in sorted({r["variant"] for r in rows}):
        lasts = [
            r["val_last"] for r in rows if r["variant"] == variant and r["val_last"] is not None
        ]
        if len(lasts) >= 2:
            lines.append(
                f"| **{variant} mean ± std** | n={len(lasts)} | | | | "
                f"{statistics.mean(lasts):.3f} ± {statistics.stdev(lasts):.3f} | |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=3)
    parser.add_argument("--variants", default="watch,rollback")
    parser.add_argument("--val-limit", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("/tmp/forced_collapse"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.json"
    done = json.loads(results.read_text()) if results.is_file() else []
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for variant in args.variants.split(","):
            kept = [
                r for r in done if (r["variant"], r["seed"], r["returncode"]) == (variant, seed, 0)
            ]
            rows.append(kept[0] if kept else run_one(variant, seed, args))  # a re-run resumes
            (args.out / "results.json").write_text(json.dumps(rows, indent=1))
            print(json.dumps(rows[-1]), flush=True)
    text = table(rows)
    (args.out / "results.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
