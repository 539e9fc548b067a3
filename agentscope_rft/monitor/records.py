"""`metrics.jsonl`: one JSON object per `Monitor.log` call, and reading it back for plots.

A line is `{"step": 12, "time": 1767000000.123, "phase": "train", "reward/mean": 0.41, ...}`:
`time` is Unix seconds, `phase` is `train`, `eval` or another name, non-finite values are `null`.
A resumed run appends to the same file, first a marker line `{"step": s, "time": ..., "phase":
"resume"}` at its first logged step `s`. Readers drop the records before the marker of training
steps >= s and of other phases (validation) at steps > s (the branch the resume abandoned; a
validation logged at step s evaluated the checkpoint the run resumed from), the way TensorBoard
purges events after a restart, and keep the last value per step.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import SupportsFloat

from agentscope_rft.buffer.jsonl import decode_line

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
RESERVED_KEYS = frozenset({"step", "time", "phase"})
RESUME_PHASE = "resume"
"""The `phase` of the marker line a resumed run writes before its first record."""


class MetricsFileError(ValueError):
    """`metrics.jsonl` is missing, empty or has a line that is not a metrics record."""


@dataclass(frozen=True)
class MetricRecord:
    """One line of `metrics.jsonl`: the metrics of one phase at one step."""

    step: int
    phase: str
    time: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    """Values by name; `null` in the file reads as NaN."""


def normalize_metrics(metrics: Mapping[str, object]) -> dict[str, float | int]:
    """Plain Python numbers for every value: ints stay ints, numpy/torch scalars become floats.

    Raises:
        ValueError: a name is empty or reserved (`step`, `time`, `phase`).
        TypeError: a value is not a number.
    """
    clean: dict[str, float | int] = {}
    for name, value in metrics.items():
        if not name or name in RESERVED_KEYS:
            raise ValueError(f"metric name {name!r} is reserved or empty; rename the metric")
        if isinstance(value, numbers.Integral):
            clean[name] = int(value)
            continue
        if not isinstance(value, SupportsFloat):  # numpy and torch scalars pass
            raise TypeError(f"metric {name!r} is not a number: {value!r}")
        clean[name] = float(value)
    return clean


class MetricsWriter:
    """Appends records to `metrics.jsonl`, one flushed line per call."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume:
            drop_partial_last_line(path)
        elif path.exists() and path.stat().st_size > 0:
            logger.warning("new run: replacing the existing %s", path)
            path.unlink()
        self._file = path.open("a", encoding="utf-8")

    def write(self, step: int, time: float, phase: str, metrics: Mapping[str, float]) -> None:
        """Append one record; non-finite values are written as `null` (strict JSON)."""
        record: dict[str, object] = {"step": step, "time": round(time, 3), "phase": phase}
        for name, value in metrics.items():
            record[name] = value if math.isfinite(value) else None
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def mark_resume(self, step: int, time: float) -> None:
        """Write the resume marker: earlier records with step >= `step` are superseded."""
        self.write(step, time, RESUME_PHASE, {})

    def close(self) -> None:
        self._file.close()


def drop_partial_last_line(path: Path) -> None:
    """A crash mid-write leaves a last line without newline; appending would corrupt it."""
    if not path.exists():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1
    with path.open("r+b") as file:
        file.truncate(keep)
        os.fsync(file.fileno())
    logger.warning("resume: dropped a partial last line of %s (%d bytes)", path, len(data) - keep)


def read_metrics(path: Path) -> list[MetricRecord]:
    """Every record of a metrics file, in file order.

    An unterminated last line that does not parse is skipped with a warning (the run is writing
    it, or crashed while writing it); any other bad line is an error.

    Raises:
        MetricsFileError: the file is missing or empty, or a line is broken (file and line named).

    Example:
        >>> records = read_metrics(Path("runs/gsm8k/metrics.jsonl"))  # doctest: +SKIP
        >>> records[-1].metrics["reward/mean"]  # doctest: +SKIP
        0.62
    """
    if not path.is_file():
        raise MetricsFileError(
            f"no metrics file {path}: give the folder of a run started by `agentscope-rft train`"
        )
    data = path.read_bytes()
    lines = data.splitlines()
    records: list[MetricRecord] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(_parse_line(decode_line(line)))
        except ValueError as exc:
            if lineno == len(lines) and not data.endswith(b"\n"):
                logger.warning("%s line %d: skipped a partial last line (%s)", path, lineno, exc)
                continue
            raise MetricsFileError(f"{path} line {lineno}: {exc}") from None
    if not records:
        raise MetricsFileError(f"{path} is empty: no step has been logged yet")
    return records


def _parse_line(line: str) -> MetricRecord:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    step, phase, time = data.pop("step", None), data.pop("phase", "train"), data.pop("time", None)
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f"'step' must be an integer, got {step!r}")
    if not isinstance(phase, str):
        raise ValueError(f"'phase' must be a string, got {phase!r}")
    if time is not None and not _is_number(time):
        raise ValueError(f"'time' must be a number, got {time!r}")
    metrics: dict[str, float] = {}
    for name, value in data.items():
        if value is None:
            metrics[name] = math.nan
        elif _is_number(value):
            metrics[name] = float(value)
        else:
            raise ValueError(f"metric {name!r} must be a number or null, got {value!r}")
    return MetricRecord(
        step=step, phase=phase, time=None if time is None else float(time), metrics=metrics
    )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def surviving_history(records: Iterable[MetricRecord]) -> list[MetricRecord]:
    """The records without those a resume superseded, and without the resume markers.

    Example:
        >>> old = [MetricRecord(step, "train", None, {"x": 1.0}) for step in (1, 2, 3)]
        >>> new = [MetricRecord(2, RESUME_PHASE, None), MetricRecord(2, "train", None, {"x": 2.0})]
        >>> [(r.step, r.metrics["x"]) for r in surviving_history(old + new)]
        [(1, 1.0), (2, 2.0)]
    """
    kept: list[MetricRecord] = []
    for record in records:
        if record.phase == RESUME_PHASE:
            kept = before_resume(kept, record.step)
        else:
            kept.append(record)
    return kept


def before_resume(records: Iterable[MetricRecord], step: int) -> list[MetricRecord]:
    """The records a run resumed from its checkpoint after `step` steps keeps: the training
    steps before `step`, and the other phases' records up to `step` (a validation logged at
    `step` evaluated that checkpoint's policy, which the resumed run starts from).

    Example:
        >>> log = [MetricRecord(1, "train", None), MetricRecord(2, "val", None),
        ...        MetricRecord(2, "train", None), MetricRecord(3, "val", None)]
        >>> [(r.step, r.phase) for r in before_resume(log, 2)]
        [(1, 'train'), (2, 'val')]
    """
    return [r for r in records if kept_at_resume(r.step, r.phase, step)]


def kept_at_resume(at: int, phase: str, step: int) -> bool:
    """Whether a record of `phase` at step `at` survives a resume from the checkpoint after
    `step` steps (the rule of `before_resume`, for logs other than the metrics)."""
    return at < step if phase == "train" else at <= step


def per_step(records: Iterable[MetricRecord], phase: str) -> list[MetricRecord]:
    """One record per step of `phase`, sorted by step; a metric logged twice at a step keeps
    its last value (and several `log` calls for one step merge)."""
    merged: dict[int, MetricRecord] = {}
    for record in records:
        if record.phase != phase:
            continue
        earlier = merged.get(record.step)
        if earlier is not None:
            record = MetricRecord(
                step=record.step,
                phase=phase,
                time=record.time if record.time is not None else earlier.time,
                metrics={**earlier.metrics, **record.metrics},
            )
        merged[record.step] = record
    return [merged[step] for step in sorted(merged)]


def qualified_name(phase: str, name: str) -> str:
    """The name a metric has in TensorBoard, W&B and MLflow: as is for `train`, else prefixed.

    Example:
        >>> qualified_name("train", "reward/mean"), qualified_name("eval", "reward/mean")
        ('reward/mean', 'eval/reward/mean')
    """
    return name if phase == "train" else f"{phase}/{name}"


def plain_config(resolved_config: Mapping[str, object]) -> dict[str, object]:
    """The config as JSON-safe data (paths and other objects become strings) for the backends."""
    plain: dict[str, object] = json.loads(json.dumps(dict(resolved_config), default=str))
    return plain


def logged_at(run_dir: Path, step: int, phase: str) -> bool:
    """Whether the run's metrics hold a surviving `phase` record of `step` (False when its
    metrics file cannot be read).

    Example:
        >>> logged_at(Path("runs/quickstart"), 4, "val")  # doctest: +SKIP
        True
    """
    try:
        records = surviving_history(read_metrics(run_dir / METRICS_FILE))
    except MetricsFileError:
        return False
    return any(r.step == step and r.phase == phase for r in records)
