"""Greedy evaluation F1 of several training runs over their steps, in one figure.

    python examples/web_search/plot_runs.py --out runs.png \\
        "embedded, unseeded=runs/ws_emb_unseeded" "vLLM, rerun=runs/ws_vllm_rerun" \\
        --points "vLLM, run 1=0:0.033,10:0.100,20:0.167"

Each run folder's `rollouts.jsonl` holds its evaluation episodes (phase `eval`, with their `f1`
metric); the curve is their mean F1 per evaluated step. `--points` adds a run whose folder is
gone from its recorded values (`step:f1` pairs). Runs on the same engine share a line
style (solid: embedded, dashed: vLLM, by the label's first word).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def eval_f1(folder: Path) -> dict[int, float]:
    """Mean F1 of the evaluation episodes of a training run, by step."""
    by_step: dict[int, list[float]] = defaultdict(list)
    with open(folder / "rollouts.jsonl", encoding="utf-8") as handle:
        for line in handle:
            rollout = json.loads(line)
            if rollout["phase"] == "eval":
                metrics = rollout.get("metrics") or {}
                by_step[rollout["step"]].append(float(metrics.get("f1", 0.0)))
    if not by_step:
        raise SystemExit(f"{folder}: no evaluation episodes (was run.eval_every set?)")
    return {step: sum(values) / len(values) for step, values in sorted(by_step.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="label=run folder")
    parser.add_argument("--points", action="append", default=[], help="label=step:f1,step:f1,...")
    parser.add_argument("--out", type=Path, default=Path("runs.png"))
    args = parser.parse_args()
    curves = {}
    for spec in args.runs:
        label, _, folder = spec.partition("=")
        curves[label] = eval_f1(Path(folder))
    for spec in args.points:
        label, _, pairs = spec.partition("=")
        try:
            curves[label] = {
                int(step): float(f1) for step, f1 in (pair.split(":") for pair in pairs.split(","))
            }
        except ValueError:
            raise SystemExit(f"--points {spec!r}: expected label=step:f1,step:f1,...") from None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for label, curve in curves.items():
        style = "--" if label.lower().startswith("vllm") else "-"
        axes.plot(list(curve), list(curve.values()), style, marker="o", label=label)
        print(label, {step: round(f1, 3) for step, f1 in curve.items()})
    axes.set_xlabel("training step")
    axes.set_ylabel("greedy F1, first 60 test questions")
    axes.set_ylim(0, None)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
