"""A sweep's summary: per seed the validation metric at its best and last checkpoint, mean ± std.

Writes `summary.json`, `summary.md` (a markdown table a README can paste) and `seeds.png` (every
seed's validation curve and their mean) into the sweep folder. `agentscope-rft sweep-summary
runs/<name>` re-makes them; `--test` also evaluates each seed's best checkpoint, and once the
untrained model every seed started from, on the test split.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import math
import os
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentscope_rft.files import replace_text
from agentscope_rft.monitor.records import METRICS_FILE, per_step, read_metrics, surviving_history
from agentscope_rft.runtime.best import (
    BEST_DIR,
    BEST_FILE,
    best_point,
    criterion_value,
    metric_label,
    metric_names,
)
from agentscope_rft.runtime.components import CHECKPOINTS, STATE_FILE, checkpoint_dir, read_state
from agentscope_rft.runtime.sweep import (
    BASELINE_DIR,
    BEST_TEST_DIR,
    SweepError,
    read_sweep,
    seed_finished,
)

SUMMARY_JSON, SUMMARY_MD, SEEDS_PLOT = "summary.json", "summary.md", "seeds.png"
DEFAULT_METRIC, DEFAULT_MODE = "val/reward/mean", "max"
TEST_METRICS = ("reward/mean", "success_rate")

logger = logging.getLogger(__name__)
"""Test metrics shown in the table (summary.json keeps every metric explore returns)."""


def split_metric(metric: str) -> tuple[str, str]:
    """`val/reward/mean` -> (`val`, `reward/mean`); a name without a phase is a train metric.

    Example:
        >>> split_metric("val/success_rate"), split_metric("loss")
        (('val', 'success_rate'), ('train', 'loss'))
    """
    phase, slash, name = metric.partition("/")
    if slash and phase in ("val", "eval", "train"):
        return phase, name
    return "train", metric


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, sample standard deviation (n - 1; null below 2 values) and n of finite values.

    Example:
        >>> spread([0.2, 0.4, 0.9])
        {'mean': 0.5, 'std': 0.36055512754639896, 'n': 3}
    """
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return {"mean": None, "std": None, "n": 0}
    std = statistics.stdev(finite) if len(finite) > 1 else None
    return {"mean": statistics.fmean(finite), "std": std, "n": len(finite)}


def seed_result(
    run_dir: Path, metric: str | Sequence[str], mode: str, *, eval_is_test: bool = False
) -> dict[str, Any]:
    """One seed's curve of `metric` (several: their mean), its best point and its value at the
    last checkpoint.

    The best point is `best.json` when the run kept a best checkpoint, else the best validation
    record (and the model is the last checkpoint's). Phase `val` falls back to `eval` (older runs,
    whose `eval` was their validation); `eval_is_test` (a config with `tasks.eval` and no
    `tasks.val`): those records are the test split, and no best is chosen on them.
    """
    split = [split_metric(m) for m in metric_names(metric)]
    phase, names = split[0][0], [name for _, name in split]
    records = surviving_history(read_metrics(run_dir / METRICS_FILE))
    if phase == "val" and not any(r.phase == "val" for r in records):
        phase = "eval"
    values = [(r.step, criterion_value(r.metrics, names)) for r in per_step(records, phase)]
    curve = [(step, v) for step, v in values if v is not None and math.isfinite(v)]
    last_step = int(read_state(run_dir)["step"]) if (run_dir / STATE_FILE).is_file() else None
    last_model = checkpoint_dir(run_dir, last_step) / "model" if last_step is not None else None
    best_file = run_dir / BEST_FILE
    best_at: dict[str, Any]
    best_model: Path | None
    if best_file.is_file():
        best = json.loads(best_file.read_text())
        best_at = {"step": int(best["step"]), "value": float(best["value"])}
        best_model = run_dir / CHECKPOINTS / BEST_DIR / "model"
    elif curve and not (phase == "eval" and eval_is_test):
        step, value = best_point(curve, mode) or (None, None)
        best_at, best_model = {"step": step, "value": value}, last_model
    else:
        best_at, best_model = {"step": None, "value": None}, last_model
    at_last = [v for s, v in curve if s == last_step] or [v for _, v in curve[-1:]]
    last_point = {
        "step": last_step if last_step is not None else (curve[-1][0] if curve else None),
        "value": at_last[-1] if at_last else None,
    }
    return {
        "run": run_dir.name,
        "phase": phase,
        "best": best_at,
        "last": last_point,
        "best_model": str(best_model) if best_model is not None else None,
        "checkpoint": "best" if best_file.is_file() else "last",
        "curve": [[s, v] for s, v in curve],
    }


def summarize(sweep_dir: Path, *, test: bool = False) -> dict[str, Any]:
    """Write `summary.json`, `summary.md` and `seeds.png` for the sweep; returns the summary.

    Seeds not done are listed with their status and left out of mean ± std. `test`: evaluate
    each done seed's best checkpoint on the test split first (`explore`, in this process).

    Example:
        >>> summary = summarize(Path("runs/quickstart"))  # doctest: +SKIP
        >>> summary["best"]["mean"], summary["best"]["n"]  # doctest: +SKIP
    """
    data = read_sweep(sweep_dir)
    missing = [key for key in ("seeds", "runs", "status", "config") if key not in data]
    if missing:
        raise SweepError(
            f"{sweep_dir / 'sweep.json'} has no {', '.join(missing)}: it is not the file "
            "`agentscope-rft train --seeds` writes"
        )
    run = data["config"].get("run", {})
    criterion = run.get("best_metric") or DEFAULT_METRIC
    metric = metric_label(criterion)
    mode = run.get("best_mode") or DEFAULT_MODE
    steps = int(run.get("steps", 0))
    tasks = data["config"].get("tasks", {})
    # `tasks.val` in the schema but unset: `eval` records are the test split (an older config,
    # without the key, validated on `eval`)
    eval_is_test = "val" in tasks and tasks["val"] is None
    seeds: dict[str, dict[str, Any]] = {}
    for seed in data["seeds"]:
        key, run_dir = str(seed), sweep_dir / data["runs"][str(seed)]
        status = data["status"].get(key, "pending")
        if status != "done" and seed_finished(run_dir, steps):
            status = "done"  # the sweep was killed after the seed ended, as --resume sees it
        if status == "done" and not (run_dir / METRICS_FILE).is_file():
            status = "missing"
            logger.warning(
                "seed %s: sweep.json says done, but %s is gone; the seed is left out of mean ± std",
                key,
                run_dir / METRICS_FILE,
            )
        result: dict[str, Any] = {"status": status, "run": run_dir.name}
        if status == "done":
            result.update(seed_result(run_dir, criterion, mode, eval_is_test=eval_is_test))
            unchosen = eval_is_test and result["phase"] == "eval" and result["curve"]
            if result["best"]["value"] is None and not unchosen:
                _warn_unlogged(key, run_dir, criterion, result["phase"])
            if test:
                result["test"] = evaluate_best(run_dir, result["best_model"])
            elif (run_dir / BEST_TEST_DIR / "summary.json").is_file():
                result["test"] = json.loads((run_dir / BEST_TEST_DIR / "summary.json").read_text())
        seeds[key] = result
    done = [r for r in seeds.values() if "best" in r]
    on_test = [k for k, r in seeds.items() if eval_is_test and r.get("phase") == "eval"]
    if on_test:
        logger.warning(
            "tasks.val is not set: the in-training evaluation of seed(s) %s is of the test split "
            "(tasks.eval), so no best checkpoint is chosen on it (the table shows its last "
            "value) and --test evaluates each seed's last checkpoint. Set tasks.val to a "
            "validation file to choose checkpoints",
            ", ".join(on_test),
        )
    summary: dict[str, Any] = {
        # the sweep's name, not its folder's: an artefacts copy (`results/`) makes the same table
        "name": run.get("name") or sweep_dir.name,
        "metric": metric,
        "mode": mode,
        "seeds": seeds,
        "best": spread([r["best"]["value"] for r in done]),
        "last": spread([r["last"]["value"] for r in done]),
        "failed": [s for s in data["seeds"] if seeds[str(s)]["status"] == "failed"],
        "not_done": [s for s in data["seeds"] if seeds[str(s)]["status"] != "done"],
        "commit": data.get("commit"),
        "no_validation": on_test,
    }
    if test:
        summary["untrained"] = evaluate_untrained(sweep_dir)
    elif (sweep_dir / BASELINE_DIR / "summary.json").is_file():
        summary["untrained"] = json.loads((sweep_dir / BASELINE_DIR / "summary.json").read_text())
    tested = [r["test"] for r in done if "test" in r]
    if tested:
        names = sorted({k for t in tested for k in t if isinstance(t[k], (int, float))})
        summary["test"] = {k: spread([t[k] for t in tested if k in t]) for k in names}
    try:  # each file whole, the new or the old (a full disk must not cut a committed table)
        replace_text(sweep_dir / SUMMARY_JSON, json.dumps(summary, indent=1))
        replace_text(sweep_dir / SUMMARY_MD, markdown_table(summary))
        plot_seeds(summary, sweep_dir / SEEDS_PLOT)
    except OSError as exc:
        raise SweepError(
            f"cannot write the summary into {sweep_dir}: {exc.strerror or exc}; each of its files "
            "is whole (the new one or the one before): make room, or summarize a copy of the "
            "sweep on a disk with room"
        ) from exc
    return summary


def _warn_unlogged(seed: str, run_dir: Path, criterion: str | Sequence[str], phase: str) -> None:
    """A done seed without a value of the sweep's metric (another config, a run without
    validation) would be a silent dash in the table."""
    records = [r for r in read_metrics(run_dir / METRICS_FILE) if r.phase == phase]
    logged = sorted({name for r in records for name in r.metrics})
    wanted = split_metric(metric_names(criterion)[0])[1]
    near = difflib.get_close_matches(wanted, logged, n=6, cutoff=0.3) or logged[:6]
    logger.warning(
        "seed %s: %s logs no %s (%s); the seed is left out of mean ± std",
        seed,
        run_dir / METRICS_FILE,
        metric_label(criterion),
        f"its {phase} records log {len(logged)} metrics, e.g. {', '.join(near)}"
        if logged
        else f"it has no {phase} records: does its config validate (tasks.val, run.eval_every)?",
    )


def evaluate_best(run_dir: Path, best_model: str | None) -> dict[str, float]:
    """Explore the test split with the seed's best checkpoint; writes `test-best/` in its folder.

    An evaluation of this model is reused (for `checkpoints/best`, one written after the seed's
    best was chosen: `test-best/summary.json` newer than `best.json`), so a `--test` that was
    stopped goes on where it was and a second `--test` looks at the test split no second time.
    An earlier evaluation of another checkpoint is replaced (explore warns: a second look).
    """
    if best_model is None or not Path(best_model).is_dir():
        raise SweepError(f"{run_dir}: no checkpoint to test ({best_model or 'state.json missing'})")
    out = run_dir / BEST_TEST_DIR
    done, chosen = out / "summary.json", run_dir / BEST_FILE
    if done.is_file():
        from agentscope_rft.runtime.explore import tested_model  # (explore says a second look)

        tested = tested_model(out)
        same_model = _same_model(tested, out, best_model) if tested else None
        if chosen.is_file():  # the best's folder is the same for every best: its time tells
            fresh = done.stat().st_mtime > chosen.stat().st_mtime and same_model is not False
        else:  # a step's checkpoint: the model recorded by the evaluation tells
            fresh = bool(same_model)
        if fresh:
            logger.info(
                "%s: the test evaluation of its best checkpoint is reused (%s)", run_dir, done
            )
            return dict(json.loads(done.read_text()))
    return _evaluate(run_dir / "config.yaml", [f"model.name_or_path={best_model}"], out)


def evaluate_untrained(sweep_dir: Path) -> dict[str, float]:
    """The config's own (untrained) model on the test split, once per sweep: `test-untrained/`.

    Every seed starts from this model, so it is the baseline a seed's gain is measured from. An
    earlier evaluation of the same model is reused (`test-untrained/summary.json`); one whose
    `config.yaml` names another model is refused.
    """
    out = sweep_dir / BASELINE_DIR
    done = out / "summary.json"
    if done.is_file():
        from agentscope_rft.runtime.explore import tested_model

        tested = tested_model(out)
        model = read_sweep(sweep_dir)["config"]["model"]["name_or_path"]
        if tested is not None and not _same_model(tested, out, model):
            raise SweepError(
                f"{out} is of {tested}, not of this sweep's {model}: it is no baseline of this "
                f"sweep; remove the folder (--test then evaluates {model}) or copy in the "
                "evaluation of this model"
            )
        return dict(json.loads(done.read_text()))
    return _evaluate(sweep_dir / "config.yaml", [], out)


def _same_model(tested: str, out: Path, model: str) -> bool:
    """Whether an evaluation's model (a path relative to its folder in an artefacts export) is
    `model`: the same name, or the same folder."""
    here = out / tested
    return tested == model or (here.exists() and here.resolve() == Path(model).resolve())


def _evaluate(config_path: Path, overrides: list[str], out: Path) -> dict[str, float]:
    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.explore import explore

    config = load_config(config_path, overrides)
    split = "test" if "test" in type(config.tasks).model_fields else "eval"
    if getattr(config.tasks, split) is None:
        raise SweepError(f"--test: tasks.{split} is not set in {config_path}")
    metrics = asyncio.run(explore(config, out, split=split))
    (out / "summary.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _step_cell(step: int | None) -> str:
    return "–" if step is None else str(step)


def _mean_std(stats: dict[str, Any]) -> str:
    if stats["mean"] is None:
        return "–"
    std = "n/a" if stats["std"] is None else f"{stats['std']:.3g}"
    return f"{stats['mean']:.4g} ± {std} (n={stats['n']})"


def shown_metric(summary: dict[str, Any]) -> str:
    """The name of what the table's columns and `seeds.png` show: the sweep's metric, or, for
    a sweep without a validation split, the in-training evaluation of the test split it read.

    Example:
        >>> shown_metric({"metric": "val/reward/mean", "no_validation": ["0"]})
        'eval/reward/mean (test split)'
    """
    if not summary.get("no_validation"):
        return str(summary["metric"])
    return re.sub(r"\bval/", "eval/", summary["metric"]) + " (test split)"


def markdown_table(summary: dict[str, Any], name: str | None = None) -> str:
    """The summary as a markdown table: one row per seed, then mean ± sample std (n), headed by
    `name` (default: the sweep's `run.name` the summary holds)."""
    name = name or summary.get("name") or "sweep"
    metric = shown_metric(summary)
    test_names = [k for k in TEST_METRICS if k in summary.get("test", {})]
    head = ["seed", "status", "best step", f"best {metric}", "last step", f"last {metric}"]
    tested = {r.get("checkpoint", "best") for r in summary["seeds"].values() if "test" in r}
    which = "best" if tested <= {"best"} else "last" if tested == {"last"} else "best or last"
    head += [f"test {k} ({which} ckpt)" for k in test_names]
    lines = [
        f"Seeds of `{name}`: {metric} ({summary['mode']}), mean ± sample std across seeds.",
        "",
    ]
    if summary.get("no_validation"):
        lines += [
            f"Seed(s) {', '.join(summary['no_validation'])}: no validation split (tasks.val); "
            "their in-training values are of the test split (tasks.eval), no best is chosen on "
            "them, and their test is of the last checkpoint.",
            "",
        ]
    lines += [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for seed, result in summary["seeds"].items():
        best, last = result.get("best", {}), result.get("last", {})
        row = [seed, result["status"], _step_cell(best.get("step")), _cell(best.get("value"))]
        row += [_step_cell(last.get("step")), _cell(last.get("value"))]
        row += [_cell(result.get("test", {}).get(k)) for k in test_names]
        lines.append("| " + " | ".join(row) + " |")
    row = ["mean ± std", "", "", _mean_std(summary["best"]), "", _mean_std(summary["last"])]
    row += [_mean_std(summary["test"][k]) for k in test_names]
    lines.append("| " + " | ".join(row) + " |")
    if test_names and "untrained" in summary:
        row = ["untrained", "", "", "", "", ""]
        row += [_cell(summary["untrained"].get(k)) for k in test_names]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot_seeds(summary: dict[str, Any], path: Path) -> Path | None:
    """One plot: every seed's validation curve (without a validation split: its in-training
    test evaluation, and so labelled), and their mean at the steps all seeds share."""
    curves = {seed: r["curve"] for seed, r in summary["seeds"].items() if r.get("curve")}
    if not curves:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for seed, curve in curves.items():
        steps, values = zip(*curve, strict=True)
        axes.plot(
            steps, values, marker="o", markersize=3, linewidth=1, alpha=0.6, label=f"seed {seed}"
        )
    by_step: dict[int, list[float]] = {}
    for curve in curves.values():
        for step, value in curve:
            by_step.setdefault(step, []).append(value)
    shared = sorted(s for s, v in by_step.items() if len(v) == len(curves))
    if shared:
        means = [statistics.fmean(by_step[s]) for s in shared]
        axes.plot(shared, means, color="black", linewidth=2.2, label=f"mean of {len(curves)}")
    axes.set_xlabel("step")
    metric = shown_metric(summary)
    axes.set_ylabel(metric)
    axes.set_title(f"{metric} by seed")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    try:
        figure.savefig(partial, format="png")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path
