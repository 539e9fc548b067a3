"""The one-line summary of a step printed to the console.

step 12 | reward 0.41±0.33 | success 44% | len 37 | kl 0.002 | ent 1.21 | gnorm 0.8 | ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from agentscope_rft.monitor.config import DEFAULT_CONSOLE_METRICS


def _num(value: float) -> str:
    """Three significant digits, without scientific notation for large values."""
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _reward(value: float) -> str:
    """Two decimals for the usual reward scales (steady width across lines), else `_num`."""
    if value == 0 or 0.095 <= abs(value) < 1000:
        return f"{value:.2f}"
    return _num(value)


def _percent(value: float) -> str:
    return f"{value * 100:.0f}%"


def _seconds(value: float) -> str:
    return f"{value:.1f}s"


# Known metric -> (label, value format). The label goes before the value, except where the
# format already reads as a unit ("310 tok/s").
_FORMATS: dict[str, tuple[str, Callable[[float], str]]] = {
    "reward/mean": ("reward", _reward),
    "reward/min": ("min", _reward),
    "reward/max": ("max", _reward),
    "success_rate": ("success", _percent),
    "response_length/mean": ("len", lambda v: f"{v:.0f}"),
    "kl/mean": ("kl", lambda v: f"{v:.2g}"),
    "entropy/mean": ("ent", lambda v: f"{v:.2f}"),
    "grad_norm": ("gnorm", _num),
    "loss": ("loss", _num),
    "lr": ("lr", lambda v: f"{v:.2g}"),
    "policy_version": ("version", lambda v: f"{v:.0f}"),
    "trajectory/merge_rate": ("merged", _percent),
    "explore/failed": ("failed", lambda v: f"{v:.0f}"),
    "time/explore": ("explore", _seconds),
    "time/train": ("train", _seconds),
    "time/sync": ("sync", _seconds),
    "time/step": ("total", _seconds),
}
_UNIT_SUFFIX: dict[str, str] = {"tokens_per_s": "tok/s", "rollouts_per_s": "rollouts/s"}
_HIDDEN_WHEN_ZERO = frozenset({"explore/failed"})


def _segment(name: str, value: float, metrics: Mapping[str, float]) -> str | None:
    if name in _HIDDEN_WHEN_ZERO and value == 0:
        return None
    if name in _UNIT_SUFFIX:
        return f"{_num(value)} {_UNIT_SUFFIX[name]}"
    label, fmt = _FORMATS.get(name, (name, _num))
    text = f"{label} {fmt(value)}"
    if name == "reward/mean" and "reward/std" in metrics:
        text += f"±{_reward(metrics['reward/std'])}"
    return text


def format_step_line(
    step: int,
    metrics: Mapping[str, float],
    *,
    phase: str = "train",
    keys: Sequence[str] = DEFAULT_CONSOLE_METRICS,
) -> str:
    """One compact line for a step: the metrics in `keys` that are present, in that order.

    Known metrics get short labels (`reward` with `±std` when `reward/std` is logged, `success`
    in percent, `tok/s`); consecutive `time/*` metrics share one segment; other names print as
    `name value`. A phase other than `train` is marked at the start of the line.

    Args:
        step: The step number.
        metrics: Values by metric name; names not in `keys` are not shown.
        phase: `train`, `eval`, or another phase name.
        keys: The metric names to show, in order.

    Returns:
        The line, without a trailing newline.

    Example:
        >>> format_step_line(12, {"reward/mean": 0.41, "reward/std": 0.33, "success_rate": 0.44,
        ...                       "time/explore": 21.3, "time/train": 9.8, "extra": 1.0})
        'step 12 | reward 0.41±0.33 | success 44% | explore 21.3s train 9.8s'
        >>> format_step_line(12, {"reward/mean": 0.52}, phase="eval")
        '[eval] step 12 | reward 0.52'
        >>> format_step_line(3, {"reward/mean": 0.5, "health/entropy_collapse": 3.0})
        'step 3 | reward 0.50 | health! entropy_collapse -> rollback'
    """
    segments: list[str] = [f"step {step}" if phase == "train" else f"[{phase}] step {step}"]
    previous_was_time = False
    for name in keys:
        if name not in metrics:
            continue
        text = _segment(name, float(metrics[name]), metrics)
        if text is None:
            continue
        is_time = name.startswith("time/")
        if is_time and previous_was_time:
            segments[-1] += f" {text}"
        else:
            segments.append(text)
        previous_was_time = is_time
    # Health events are always shown, whatever `keys` says (the run acts on them).
    actions = {1.0: "warn", 2.0: "stop", 3.0: "rollback"}
    events = [
        f"{name.removeprefix('health/')} -> {actions.get(float(value), 'warn')}"
        for name, value in metrics.items()
        if name.startswith("health/") and name != "health/events" and value
    ]
    if events:
        segments.append("health! " + ", ".join(events))
    return " | ".join(segments)
