"""Plot an ALFWorld run's success rate: validation per evaluation, sampled games per step, and
test games per checkpoint when given.

The validation curve (phase `val`, greedy, `tasks.val`) and the sampled curve (`success_rate` of
each step's training episodes) come from the run's `metrics.jsonl`; test points from `agentscope-rft
explore --split test` folders, one per checkpoint with its step. The best checkpoint
(`best.json`) is marked; the warm-up steps (SFT on demonstrations, no episodes) are shaded.

    python examples/alfworld/plot_results.py --run runs/alfworld/seed-0  # <run>/success_curve.png
    python examples/alfworld/plot_results.py --run runs/alfworld/seed-0 \\
        --heldout 16=runs/alfworld-test-16 20=runs/alfworld/seed-0/test-best --out curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from matplotlib.figure import Figure


def heldout_success(folder: Path) -> tuple[float, int]:
    """(success rate, games) of an `explore` folder's results.jsonl."""
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    if not rows:
        raise SystemExit(f"{folder}/results.jsonl is empty: was the evaluation finished?")
    return sum(r["success_rate"] for r in rows) / len(rows), len(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the training run's folder")
    parser.add_argument(
        "--heldout", nargs="*", default=[], help="STEP=EXPLORE_FOLDER pairs of test evaluations"
    )
    parser.add_argument(
        "--other", nargs="*", default=[], help="STEP=FOLDER pairs of a second run, held out"
    )
    parser.add_argument("--other-label", default="another run, test games, greedy")
    parser.add_argument("--out", type=Path, help="default: <run>/success_curve.png")
    args = parser.parse_args(argv)
    out = args.out or args.run / "success_curve.png"
    if not (args.run / "metrics.jsonl").is_file():
        raise SystemExit(
            f"{args.run}/metrics.jsonl does not exist; pass a run folder (for a seed sweep, one "
            "seed's folder: runs/<name>/seed-<k>)"
        )
    metrics = [json.loads(x) for x in (args.run / "metrics.jsonl").read_text().splitlines()]
    resolved = args.run / "config.yaml"  # the run's resolved config
    config = yaml.safe_load(resolved.read_text()) if resolved.exists() else {}
    warmup = int(config.get("offline", {}).get("warmup_steps", 0))
    sampled = sorted(
        (r["step"] + 1, r["success_rate"])
        for r in metrics
        if r.get("phase") == "train" and "success_rate" in r
    )
    validation = sorted(
        (r["step"], r["success_rate"])
        for r in metrics
        if r.get("phase") == "val" and "success_rate" in r
    )
    best_file = args.run / "best.json"
    best = json.loads(best_file.read_text()) if best_file.is_file() else None

    def read(pairs: list[str]) -> list[tuple[int, float, int]]:
        out = []
        for item in pairs:
            step, _, folder = item.partition("=")
            rate, games = heldout_success(Path(folder))
            out.append((int(step), rate, games))
        return sorted(out)

    points, other = read(args.heldout), read(args.other)

    figure = Figure(figsize=(8, 4.5), dpi=110, layout="constrained")
    ax = figure.subplots()
    if warmup:
        ax.axvspan(0, warmup, color="0.9", label=f"warm-up: SFT on demonstrations ({warmup} steps)")
    if sampled:
        ax.plot(
            *zip(*sampled, strict=True),
            "o-",
            ms=3,
            color="tab:blue",
            alpha=0.6,
            label="sampled training episodes (T=1.0)",
        )
    if validation:
        ax.plot(
            *zip(*validation, strict=True),
            "D-",
            color="tab:green",
            lw=2,
            label="validation games, greedy (picks the best checkpoint)",
        )
    if best is not None:
        ax.axvline(
            best["step"], color="tab:green", ls=":", label=f"best checkpoint (step {best['step']})"
        )
    if points:
        games = points[0][2]
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            "s-",
            color="tab:red",
            lw=2,
            label=f"test games, greedy ({games})",
        )
        for step, rate, _ in points:
            ax.annotate(
                f"{rate:.2f}",
                (step, rate),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
    if other:
        ax.plot(
            [p[0] for p in other],
            [p[1] for p in other],
            "^--",
            color="0.45",
            label=args.other_label,
        )
        for step, rate, _ in other:
            ax.annotate(
                f"{rate:.2f}",
                (step, rate),
                textcoords="offset points",
                xytext=(0, -12),
                ha="center",
                fontsize=8,
                color="0.35",
            )
    ax.set_xlabel("training step (after the step)")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("ALFWorld pick_and_place_simple, small rooms, 10 commands: SmolLM2-135M on CPU")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    print(out)


if __name__ == "__main__":
    main()
