"""The best checkpoint by a validation metric: `checkpoints/best/` and `best.json`.

After every validation (`run.eval_every`) the run compares `run.best_metric` (one metric, or the
mean of several, e.g. the per-type rewards of the question types a claim counts) with the best so
far; a better value exports the current policy to `checkpoints/best/model` (an HF folder you can
serve) and records `{"step", "metric", "value", "mode"}` in `<run_dir>/best.json`. The folder is
outside the `step-*` checkpoints, so `run.keep_checkpoints` never deletes it. Commands that take a
checkpoint accept `best` (and `last`) through `resolve_checkpoint`.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentscope_rft.files import replace_text

logger = logging.getLogger(__name__)

BEST_FILE = "best.json"
BEST_DIR = "best"
RUN_STATE_FILE = "run_state.json"
"""In every checkpoint folder: the task position and health changes of its step (a rollback
restores them with the weights; a fork starts from them). Written last: a step folder without it
is a checkpoint whose writing was cut off."""


class CheckpointNotFoundError(ValueError):
    """A checkpoint name (`best`, `last`, a folder) that names nothing usable."""


class BestCheckpoint:
    """Keeps `checkpoints/best` at the best `metric` (`val/<name>`) seen by the run.

    Example:
        >>> best = BestCheckpoint(Path("runs/demo"), "val/reward/mean", "max")  # doctest: +SKIP
        >>> best.consider(10, {"reward/mean": 0.6}, trainer.export_hf)  # doctest: +SKIP
        True
    """

    def __init__(self, run_dir: Path, metric: str | Sequence[str], mode: str) -> None:
        self.run_dir = run_dir
        self.metric = metric_label(metric)
        self.names = [m.removeprefix("val/") for m in metric_names(metric)]
        self.mode = mode
        self.record = read_best(run_dir)
        chosen_by = (
            None if self.record is None else (self.record.get("metric"), self.record.get("mode"))
        )
        if chosen_by is not None and chosen_by != (self.metric, mode):
            logger.warning(
                "best.json was chosen by %s (%s), this run chooses by %s (%s): starting the best "
                "anew",
                *chosen_by,
                self.metric,
                mode,
            )
            self.record = None

    def better(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.record is None:
            return True
        best = float(self.record["value"])
        return value > best if self.mode == "max" else value < best

    def consider(
        self, step: int, metrics: Mapping[str, float], export: Callable[[Path], None]
    ) -> bool:
        """Keep the policy of `step` as the best if its validation `metrics` beat the best so far
        (`export(folder)` writes the policy as an HF model folder). Returns whether it did."""
        missing = [name for name in self.names if name not in metrics]
        if missing:
            logger.warning(
                "run.best_metric %s: the validation did not log %s (it logged: %s); no best "
                "checkpoint kept",
                self.metric,
                ", ".join(missing),
                ", ".join(sorted(metrics)[:24]),
            )
            return False
        value = criterion_value(metrics, self.names)
        if value is None:
            logger.warning(
                "validation at step %d: every episode failed (their errors are in %s): no "
                "measurement, so not a candidate for the best checkpoint",
                step,
                self.run_dir / "rollouts.jsonl",
            )
            return False
        if not self.better(value):
            return False
        folder = self.run_dir / "checkpoints" / BEST_DIR
        staging = folder.with_name(BEST_DIR + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        record = {"step": step, "metric": self.metric, "value": float(value), "mode": self.mode}
        try:
            export(staging / "model")
            (staging / BEST_FILE).write_text(json.dumps(record))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # (a full disk: a half model holds it)
            raise
        # Swap whole folders, so a crash leaves the old best or the new one, never half of one.
        old = folder.with_name(BEST_DIR + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            folder.rename(old)
        staging.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
        write_json(self.run_dir / BEST_FILE, record)
        self.record = record
        logger.info("best checkpoint: step %d, %s = %.4g", step, self.metric, value)
        return True

    def rewind(
        self, step: int, curve: Sequence[tuple[int, float]], policy: Callable[[int], Path | None]
    ) -> None:
        """A rollback to `step` abandoned the policies after it: a best among them gives way to
        the best validation of `curve` (the run's kept (step, value) points) up to `step` whose
        policy is still at hand (`policy(step)`: an HF folder, or None), or to none.

        Example:
            >>> best.rewind(4, [(0, 0.2), (4, 0.3)], kept_models.get)  # doctest: +SKIP
        """
        if self.record is None or int(self.record["step"]) <= step:
            return
        abandoned = self.record
        at_hand = [(s, v) for s, v in curve if s <= step and policy(s) is not None]
        point = best_point([(s, v) for s, v in at_hand if math.isfinite(v)], self.mode)
        shutil.rmtree(self.run_dir / "checkpoints" / BEST_DIR, ignore_errors=True)
        (self.run_dir / BEST_FILE).unlink(missing_ok=True)
        self.record = None
        if point is None:
            logger.warning(
                "best checkpoint: step %d was abandoned by the rollback to step %d, and no kept "
                "validation up to it has its policy at hand: no best checkpoint until the next "
                "validation",
                abandoned["step"],
                step,
            )
            return
        source = policy(point[0])
        assert source is not None

        def copy(folder: Path) -> None:
            shutil.copytree(source, folder)

        self.consider(point[0], {name: point[1] for name in self.names}, copy)
        logger.warning(
            "best checkpoint: step %d was abandoned by the rollback to step %d; the best kept is "
            "step %d",
            abandoned["step"],
            step,
            point[0],
        )


def kept_curve(run_dir: Path, names: Sequence[str]) -> list[tuple[int, float]]:
    """The (step, criterion value) of the validations the run kept (a resume or rollback
    supersedes the rest), as `metrics.jsonl` holds them."""
    from agentscope_rft.monitor.records import (
        METRICS_FILE,
        per_step,
        read_metrics,
        surviving_history,
    )

    records = per_step(surviving_history(read_metrics(run_dir / METRICS_FILE)), "val")
    values = [(r.step, criterion_value(r.metrics, names)) for r in records]
    return [(step, value) for step, value in values if value is not None]


def metric_names(metric: str | Sequence[str]) -> list[str]:
    """The metrics `run.best_metric` names: one, or several whose mean is the criterion."""
    return [metric] if isinstance(metric, str) else list(metric)


def criterion_value(metrics: Mapping[str, float], names: Sequence[str]) -> float | None:
    """The mean of `metrics[name]` over `names` (the criterion's value), or None when one is
    missing or no episode of the evaluation finished (its metrics then are zeros, not a score).

    Example:
        >>> criterion_value({"reward/mean": 0.5, "explore/rollouts": 4}, ["reward/mean"])
        0.5
        >>> failed = {"reward/mean": 0.0, "explore/rollouts": 4, "explore/failed": 4}
        >>> criterion_value(failed, ["reward/mean"]) is None
        True
    """
    if any(name not in metrics for name in names) or not finished_any(metrics):
        return None
    return sum(float(metrics[name]) for name in names) / len(names)


def finished_any(metrics: Mapping[str, float]) -> bool:
    """Whether an evaluation's metrics come from at least one finished episode (one that
    failed or timed out has no reward: the means over none are logged as 0)."""
    rollouts = metrics.get("explore/rollouts")
    if rollouts is None:  # (not an explorer's metrics)
        return True
    lost = metrics.get("explore/failed", 0.0) + metrics.get("explore/timeout", 0.0)
    return rollouts > lost


def best_point(curve: Sequence[tuple[int, float]], mode: str) -> tuple[int, float] | None:
    """The (step, value) of `curve` that `mode` ("max" or "min") prefers, the earliest on a tie;
    NaN values never win; None for a curve without a number.

    Example:
        >>> best_point([(0, 0.2), (4, 0.5), (8, 0.5), (12, float("nan"))], "max")
        (4, 0.5)
        >>> best_point([(0, 0.2), (4, 0.5)], "min")
        (0, 0.2)
    """
    points = [(step, value) for step, value in curve if value == value]
    if not points:
        return None
    pick = max if mode == "max" else min
    return pick(points, key=lambda point: point[1])


APP_PREFIXES = ("workflow/", "runtime/", "diagnosis/", "memory/")
"""Validation metrics that only some runs log (the app's `Reward(metrics=...)`, the episode
runners', the diagnosis's findings, memory): not checked before the run."""


def validation_metrics() -> set[str]:
    """The metrics every validation logs (what `ExploreResult.metrics` writes for any batch)."""
    from agentscope_rft.explorer.explorer import ExploreResult
    from agentscope_rft.explorer.loop_monitor import LoopStats
    from agentscope_rft.explorer.trajectory import TrajectoryStats

    empty = ExploreResult([], [], TrajectoryStats(), 0.0, loop=LoopStats())
    return {name for name in empty.metrics() if not name.startswith("trajectory/")}


def best_metric_problem(
    metric: str | Sequence[str], stratify_field: str | None, val_tasks: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why `run.best_metric` names a metric the validation never logs (a typo, a stratum of
    another field or of no validation task), with the fix; None when every name can be logged.

    Example:
        >>> best_metric_problem("val/sucess_rate", None, [])  # doctest: +ELLIPSIS
        "run.best_metric names val/sucess_rate, which validation never logs; did you mean ...
    """
    known = validation_metrics()
    for full in metric_names(metric):
        name = full.removeprefix("val/")
        if name in known or name.startswith(APP_PREFIXES):
            continue
        if name.startswith("reward/by_"):
            field, _, value = name.removeprefix("reward/by_").partition("/")
            if field != stratify_field:
                return (
                    f"run.best_metric names {full}, a per-{field} reward, which validation logs "
                    f"only with tasks.stratify_field: {field} (it is {stratify_field!r}): set it, "
                    "or choose another metric"
                )
            values = sorted({str(t[field]) for t in val_tasks if field in t})
            if value in values:
                continue
            return (
                f"run.best_metric names {full}, but no validation task has {field} {value!r} "
                f"(the validation slice has: {', '.join(values)}); use "
                f"val/reward/by_{field}/<one of them>"
            )
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean val/{close[0]}? " if close else ""
        scores = [f"val/{k}" for k in sorted(known) if k.startswith(("reward/", "success", "resp"))]
        return (
            f"run.best_metric names {full}, which validation never logs; {hint}(it logs "
            f"{', '.join(scores)}, val/reward/by_<tasks.stratify_field>/<value>, the app's "
            "val/workflow/<name>, ...: see the `val` lines of metrics.jsonl)"
        )
    return None


def metric_label(metric: str | Sequence[str]) -> str:
    """How `best.json`, logs and summaries name the criterion.

    Example:
        >>> metric_label("val/reward/mean")
        'val/reward/mean'
        >>> metric_label(["val/reward/by_type/a", "val/reward/by_type/b"])
        'mean(val/reward/by_type/a, val/reward/by_type/b)'
    """
    names = metric_names(metric)
    return names[0] if len(names) == 1 else f"mean({', '.join(names)})"


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    replace_text(path, json.dumps(dict(data)))


def read_best(run_dir: Path) -> dict[str, Any] | None:
    """`best.json` of a run, or None when it has none (or it is unreadable)."""
    try:
        record: dict[str, Any] = json.loads((run_dir / BEST_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and "step" in record else None


def split_checkpoint(spec: str | Path) -> tuple[Path, str | None]:
    """`<folder>:<which>` as (folder, which): `which` is `best`, `last` (`latest` says the same)
    or a step number; None when `spec` names a folder alone (an existing path is never split).

    Example:
        >>> split_checkpoint("runs/quickstart:12")
        (PosixPath('runs/quickstart'), '12')
    """
    text = str(spec)
    head, colon, which = text.rpartition(":")
    if not colon or not head or Path(text).exists():
        return Path(text), None
    return Path(head), "last" if which == "latest" else which


def resolve_checkpoint(spec: str | Path, run_dir: Path | None = None) -> Path:
    """The HF model folder a checkpoint name points at.

    `spec` is `best`, `last` or a step number (of `run_dir`), `<run folder>:best`,
    `<run folder>:last` (or `:latest`), `<run folder>:<step>`, a run folder (its best if it has
    one, else its last), a checkpoint folder (`step-000012`, `best`: its `model/`), or an HF model
    folder.

    Raises:
        CheckpointNotFoundError: nothing usable there (the message says what exists).

    Example:
        >>> resolve_checkpoint("runs/quickstart:best")  # doctest: +SKIP
        PosixPath('runs/quickstart/checkpoints/best/model')
    """
    text = str(spec)
    which: str | None
    if text in ("best", "last", "latest") or (text.isdigit() and not Path(text).exists()):
        if run_dir is None:
            raise CheckpointNotFoundError(f"checkpoint {text!r} needs a run folder")
        folder, which = run_dir, "last" if text == "latest" else text
    else:
        folder, which = split_checkpoint(text)
    if which is not None and which not in ("best", "last") and not which.isdigit():
        raise CheckpointNotFoundError(
            f"{text}: unknown checkpoint {which!r}; use <run folder>:best, :last or :<step> "
            f"(e.g. {folder}:best)"
        )
    if which is None and (folder / "config.json").is_file():
        return folder  # an HF model folder
    if which is None and (folder / "model" / "config.json").is_file():
        return folder / "model"  # a checkpoint folder
    if not folder.exists():
        raise CheckpointNotFoundError(f"{folder} does not exist")
    if (folder / "sweep.json").is_file():
        seeds = sorted(p.parent.name for p in folder.glob("seed-*/config.yaml"))
        raise CheckpointNotFoundError(
            f"{folder} is a seed sweep: name one seed's run ({folder / (seeds or ['seed-0'])[0]}"
            f":{which or 'best'}); sweep-summary lists each seed's best"
        )
    if not (folder / "checkpoints").is_dir():
        if (folder / "config.yaml").is_file():  # a run stopped before its first checkpoint
            raise CheckpointNotFoundError(f"{folder} has no saved checkpoint yet")
        raise CheckpointNotFoundError(
            f"{folder} is not a run folder (no checkpoints/), a checkpoint or an HF model folder"
        )
    best = folder / "checkpoints" / BEST_DIR / "model"
    if which in (None, "best") and (best / "config.json").is_file():
        return best
    if which == "best":
        raise CheckpointNotFoundError(
            f"{folder} has no best checkpoint: a run keeps one only when it validates "
            "(tasks.val with run.eval_every); use `last` or a step folder"
        )
    # A step folder whose writing was cut off (a kill) has no run state: not a checkpoint.
    steps = sorted((folder / "checkpoints").glob(f"step-*/{RUN_STATE_FILE}"))
    steps = [s.parent / "model" for s in steps if (s.parent / "model" / "config.json").is_file()]
    if not steps:
        raise CheckpointNotFoundError(f"{folder} has no saved checkpoint yet")
    if which is not None and which.isdigit():
        wanted = f"step-{int(which):06d}"
        for step in steps:
            if step.parent.name == wanted:
                return step
        kept = ", ".join(str(int(s.parent.name.removeprefix("step-"))) for s in steps)
        raise CheckpointNotFoundError(
            f"{folder} has no checkpoint of step {int(which)} (it keeps steps {kept}; "
            "run.checkpoint_every and run.keep_checkpoints decide which)"
        )
    return steps[-1]
