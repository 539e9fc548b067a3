"""The reward curve of a run, drawn from its `metrics.jsonl`.

Top panel: reward mean per step, a band (±1 std, or min-max when only those are logged), a
moving average, eval points; wall-clock minutes on the top axis. Bottom panel (when logged):
success rate, train and eval. Uses matplotlib's object API (no pyplot, no global backend).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from agentscope_rft.monitor.records import (
    METRICS_FILE,
    MetricRecord,
    MetricsFileError,
    per_step,
    read_metrics,
    surviving_history,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

REWARD_CURVE_FILE = "reward_curve.png"
_MAX_MARKERS = 300  # past this, per-step dots are clutter (and most of the drawing time)
_REWARD_COLOR, _EVAL_COLOR, _SUCCESS_COLOR = "tab:blue", "tab:red", "tab:green"


def _series(records: Sequence[MetricRecord], *names: str) -> tuple[np.ndarray, ...]:
    """Steps and the values of `names` at the steps where all of them are finite."""
    rows = [
        (record.step, *(record.metrics[name] for name in names))
        for record in records
        if all(math.isfinite(record.metrics.get(name, math.nan)) for name in names)
    ]
    columns = np.array(rows, dtype=float).reshape(len(rows), len(names) + 1)
    return tuple(columns.T)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over `window` points (fewer at the start), same length as `values`.

    Example:
        >>> moving_average(np.array([1.0, 3.0, 5.0, 7.0]), 2).tolist()
        [1.0, 2.0, 4.0, 6.0]
    """
    sums = np.concatenate([[0.0], np.cumsum(values)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(0, end - window)
    return np.asarray((sums[end] - sums[start]) / (end - start))


def _window(points: int) -> int:
    """Moving-average width: ~10% of the run, 3 to 50 steps; 0 (none) for very short runs."""
    return 0 if points < 6 else min(50, max(3, points // 10))


def _draw_reward(
    axes: Axes,
    train: Sequence[MetricRecord],
    evals: Sequence[MetricRecord],
    eval_label: str = "eval",
) -> str:
    """Reward panel; returns the summary for the title."""
    steps, reward = _series(train, "reward/mean")
    band_steps, mean, std = _series(train, "reward/mean", "reward/std")
    if len(band_steps):
        axes.fill_between(
            band_steps,
            mean - std,
            mean + std,
            color=_REWARD_COLOR,
            alpha=0.15,
            linewidth=0,
            label="±1 std",
        )
    else:
        band_steps, low, high = _series(train, "reward/min", "reward/max")
        if len(band_steps):
            axes.fill_between(
                band_steps, low, high, color=_REWARD_COLOR, alpha=0.15, linewidth=0, label="min–max"
            )
    summary = []
    if len(steps):
        axes.plot(
            steps,
            reward,
            color=_REWARD_COLOR,
            alpha=0.45,
            linewidth=1,
            marker="." if len(steps) <= _MAX_MARKERS else None,
            markersize=3,
            label="reward (mean over the batch)",
        )
        summary.append(f"last {reward[-1]:.3g}")
        window = _window(len(steps))
        if window:
            smooth = moving_average(reward, window)
            axes.plot(
                steps,
                smooth,
                color=_REWARD_COLOR,
                linewidth=2.2,
                label=f"moving average ({window} steps)",
            )
            summary.append(f"best moving avg {smooth.max():.3g}")
    eval_steps, eval_reward = _series(evals, "reward/mean")
    if len(eval_steps):
        axes.plot(
            eval_steps,
            eval_reward,
            color=_EVAL_COLOR,
            linestyle="--",
            marker="D",
            markersize=5,
            linewidth=1.2,
            label=eval_label,
        )
        summary.append(f"{eval_label} {eval_reward[-1]:.3g}")
    axes.set_ylabel("reward")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small", framealpha=0.8)
    return "reward " + ", ".join(summary)


def _draw_success(axes: Axes, train: Sequence[MetricRecord], evals: Sequence[MetricRecord]) -> None:
    from matplotlib.ticker import PercentFormatter

    steps, success = _series(train, "success_rate")
    eval_steps, eval_success = _series(evals, "success_rate")
    scale = 100.0 if max([*success, *eval_success], default=0.0) <= 1.0 else 1.0
    if len(steps):
        axes.plot(
            steps,
            success * scale,
            color=_SUCCESS_COLOR,
            alpha=0.45,
            linewidth=1,
            marker="." if len(steps) <= _MAX_MARKERS else None,
            markersize=3,
            label="success rate",
        )
        window = _window(len(steps))
        if window:
            axes.plot(
                steps,
                moving_average(success * scale, window),
                color=_SUCCESS_COLOR,
                linewidth=2.2,
                label=f"moving average ({window} steps)",
            )
    if len(eval_steps):
        axes.plot(
            eval_steps,
            eval_success * scale,
            color=_EVAL_COLOR,
            linestyle="--",
            marker="D",
            markersize=5,
            linewidth=1.2,
            label="eval",
        )
    axes.set_ylabel("success rate")
    axes.set_ylim(-2, 102)
    axes.yaxis.set_major_formatter(PercentFormatter(100))
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small", framealpha=0.8)


def _add_minutes_axis(axes: Axes, records: Sequence[MetricRecord]) -> None:
    """Wall-clock minutes since the first step, on the top axis (steps are not evenly timed)."""
    timed = [(r.step, r.time) for r in records if r.time is not None]
    if len(timed) < 2:
        return
    steps = np.array([step for step, _ in timed], dtype=float)
    seconds = np.maximum.accumulate(np.array([t for _, t in timed], dtype=float))
    minutes = (seconds - seconds[0]) / 60.0
    if minutes[-1] <= 0:
        return
    minutes = minutes + np.arange(len(minutes)) * 1e-9  # strictly increasing, for the inverse

    def to_minutes(x: ArrayLike) -> ArrayLike:
        return np.interp(np.asarray(x, dtype=float), steps, minutes)

    def to_steps(x: ArrayLike) -> ArrayLike:
        return np.interp(np.asarray(x, dtype=float), minutes, steps)

    top = axes.secondary_xaxis("top", functions=(to_minutes, to_steps))
    top.set_xlabel("wall-clock minutes", fontsize="small")


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Draw the reward curve of a run from its `metrics.jsonl` and save it as a PNG.

    Args:
        run_dir: The run folder (holding `metrics.jsonl`), or a metrics file itself.
        out: Where to write the PNG; default `reward_curve.png` next to the metrics file.

    Returns:
        The path of the PNG, written atomically (a viewer never sees half a file).

    Raises:
        MetricsFileError: the metrics file is missing, empty, has a broken line (file and line
            named), or holds no `reward/mean` value.

    Example:
        >>> plot_run(Path("runs/gsm8k-grpo"))  # doctest: +SKIP
        PosixPath('runs/gsm8k-grpo/reward_curve.png')
    """
    # matplotlib takes ~1 s to import: load it here, not with the CLI or the package.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics_path = run_dir if run_dir.is_file() else run_dir / METRICS_FILE
    records = surviving_history(read_metrics(metrics_path))
    train = per_step(records, "train")
    # In-training validation (`val`); runs without a validation split evaluated on `eval`.
    evals, eval_label = per_step(records, "val"), "val"
    if not evals:
        evals, eval_label = per_step(records, "eval"), "eval"
    if not any("reward/mean" in record.metrics for record in [*train, *evals]):
        raise MetricsFileError(
            f"{metrics_path}: no 'reward/mean' in {len(records)} records; nothing to plot"
        )
    has_success = any("success_rate" in record.metrics for record in [*train, *evals])
    figure = Figure(figsize=(9, 6.8 if has_success else 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    rows = 2 if has_success else 1
    grid = figure.subplots(
        rows, 1, sharex=True, squeeze=False, height_ratios=[3, 2] if has_success else [1]
    )
    panels: list[Axes] = list(grid[:, 0])
    summary = _draw_reward(panels[0], train, evals, eval_label)
    summary += _mark_best_and_health(panels, metrics_path.parent)
    if has_success:
        _draw_success(panels[1], train, evals)
    panels[-1].set_xlabel("step")
    _add_minutes_axis(panels[0], train or evals)
    figure.suptitle(f"{metrics_path.parent.name}: {summary}", fontsize="medium")
    out = out if out is not None else metrics_path.parent / REWARD_CURVE_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    try:
        figure.savefig(partial, format="png")
        os.replace(partial, out)
    except BaseException:
        partial.unlink(missing_ok=True)  # (a full disk: no empty file left behind)
        raise
    return out


def _mark_best_and_health(panels: Sequence[Axes], run_dir: Path) -> str:
    """Mark the best checkpoint's step (`best.json`) and health events (`health.jsonl`) on every
    panel; returns the title's addition."""
    from agentscope_rft.health.watcher import read_events
    from agentscope_rft.runtime.best import read_best

    best = read_best(run_dir)
    events = read_events(run_dir)
    colors = {"warn": "#d08c00", "stop": "#c0392b", "rollback": "#8e44ad"}
    for axes in panels:
        if best is not None:
            axes.axvline(best["step"], color="#2e7d32", linestyle=":", linewidth=1.4)
        for event in events:
            axes.axvline(event.step, color=colors.get(event.action, "#777777"), alpha=0.5)
    labelled = panels[0]
    if best is not None:
        labelled.plot([], [], color="#2e7d32", linestyle=":", label=f"best ({best['metric']})")
    for action in sorted({e.action for e in events}):
        labelled.plot([], [], color=colors.get(action, "#777777"), label=f"health: {action}")
    if best is not None or events:
        labelled.legend(loc="best", fontsize="small", framealpha=0.8)
    if best is None:
        return ""
    return f"; best step {best['step']} ({best['metric']} {best['value']:.3g})"
