"""Fork a run at one of its checkpoints: `agentscope-rft train --config b.yaml --fork-from
runs/a --fork-step 16`.

The fork is a new run folder that starts as `runs/a` was right after step 16 (its checkpoint:
weights, optimizer, task sampler and health state; its metrics, validations, rollouts and samples
up to there) and then trains on with `b.yaml`. Two arms forked from one warm start share their
first 16 steps exactly, so they differ only in what the second config changes (an SFT-only
control against an RL stage, two learning rates), and the shared steps are trained once.

What a fork keeps from its source, and what it drops:

- `checkpoints/step-<k>/` (copied, not linked: the fork may write beside it) becomes the fork's
  resume point, and its `run_state.json` the fork's `state.json`;
- `metrics.jsonl`, `rollouts.jsonl`, `samples.jsonl`, `diagnosis.jsonl`: the train records of
  steps before `k` and the other records (validation) of steps up to `k`, the records a run
  resumed at `k` keeps (`monitor.records.before_resume`);
- `health.jsonl`: the events of steps before `k` and of the rollbacks done by then;
- the best checkpoint by validation among the steps up to `k` (`best.json`,
  `checkpoints/best/`), when its step's checkpoint is still there;
- a SQLite buffer inside the run folder (copied with SQLite's backup, safe while the source runs);
- nothing else: later checkpoints, TensorBoard events, logs, test evaluations and reviews stay
  with the source. `fork.json` records the source, the step and the config keys that differ.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agentscope_rft.buffer.config import DEFAULT_SQLITE_NAME
from agentscope_rft.config import RunConfig, dump_config
from agentscope_rft.health.watcher import HEALTH_FILE, rewind_events
from agentscope_rft.monitor.records import (
    METRICS_FILE,
    MetricsWriter,
    before_resume,
    kept_at_resume,
    read_metrics,
    surviving_history,
)
from agentscope_rft.runtime.best import (
    BEST_DIR,
    BEST_FILE,
    RUN_STATE_FILE,
    best_point,
    criterion_value,
    metric_label,
    metric_names,
    write_json,
)
from agentscope_rft.runtime.components import (
    CHECKPOINTS,
    STATE_FILE,
    checkpoint_dir,
    write_state,
)

logger = logging.getLogger(__name__)

FORK_FILE = "fork.json"
UNFINISHED = ".fork-unfinished"
"""In a fork's folder until its `state.json` is written: a fork killed while copying is made
again by the same command."""
STEP_LOGS = ("rollouts.jsonl", "samples.jsonl", "diagnosis.jsonl")
"""JSON-lines files with a `step` and a `phase` per line, cut like the metrics."""


class ForkError(ValueError):
    """A fork that cannot be made as asked (no such run or checkpoint, a folder in the way)."""


def fork_run(source: Path, step: int, dest: Path, config: RunConfig) -> dict[str, Any]:
    """Make `dest` a run folder that resumes `source` after `step` with `config`.

    `train --resume dest` then continues from there. Returns the fork's record (`fork.json`).

    Raises:
        ForkError: `source` is no run folder or has no checkpoint at `step` (the steps it has are
            named), `step` is not before `config.run.steps`, `dest` exists (without
            `run.overwrite`) or is `source`, or the buffer lives outside the run folder.

    Example:
        >>> fork_run(Path("runs/alfworld/seed-0"), 16, Path("runs/control/seed-0"),
        ...          load_config("control.yaml"))["step"]  # doctest: +SKIP
        16
    """
    from agentscope_rft.runtime.deterministic import deterministic_config

    checkpoint = _checkpoint(source, step)
    config = deterministic_config(config)  # as the run saves it (`run.deterministic`)
    if step >= config.run.steps:
        raise ForkError(
            f"--fork-step {step}: the fork's config trains {config.run.steps} steps, so nothing "
            f"would be left after step {step}; raise run.steps or fork at an earlier step"
        )
    if config.buffer.type == "sql" and config.buffer.url is not None:
        raise ForkError(
            f"buffer.url={config.buffer.url!r}: a fork needs its own buffer, and one outside the "
            "run folder would be shared with the source; leave buffer.url unset (a SQLite file "
            "in the run folder)"
        )
    _clear(dest, source, overwrite=config.run.overwrite)
    dest.mkdir(parents=True)
    (dest / UNFINISHED).write_text(f"a fork of {source} at step {step}, being made\n")
    shutil.copytree(checkpoint, dest / CHECKPOINTS / checkpoint.name)
    (dest / "config.yaml").write_text(dump_config(config))
    if (source / METRICS_FILE).is_file():
        _cut_metrics(source / METRICS_FILE, dest / METRICS_FILE, step)
    for name in STEP_LOGS:
        if (source / name).is_file():
            _cut_lines(source / name, dest / name, step)
    health = json.loads((checkpoint / RUN_STATE_FILE).read_text()).get("health", {})
    rewind_events(source / HEALTH_FILE, step, health.get("rollbacks", 0), dest / HEALTH_FILE)
    if (source / DEFAULT_SQLITE_NAME).is_file():
        _copy_sqlite(source / DEFAULT_SQLITE_NAME, dest / DEFAULT_SQLITE_NAME)
    best = _rewind_best(source, dest, step, config)
    record: dict[str, Any] = {
        "source": str(source.resolve()),
        "step": step,
        "created": round(time.time(), 3),
        "best": best,
        "differences": config_differences(source, config),
    }
    (dest / FORK_FILE).write_text(json.dumps(record, indent=1))
    # Last: a fork killed before this line has no state to resume from, and is made again.
    write_state(dest, json.loads((checkpoint / RUN_STATE_FILE).read_text()))
    (dest / UNFINISHED).unlink()
    shown = "; ".join(record["differences"][:8]) or "none"
    logger.info("forked %s at step %d into %s; config differences: %s", source, step, dest, shown)
    return record


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of `run_dir`'s step checkpoints that hold a run state, oldest first."""
    steps = []
    for folder in (run_dir / CHECKPOINTS).glob("step-*"):
        if (folder / RUN_STATE_FILE).is_file():
            steps.append(int(folder.name.removeprefix("step-")))
    return sorted(steps)


def config_differences(source: Path, config: RunConfig, overrides: Sequence[str] = ()) -> list[str]:
    """`key: old -> new` for each config key `config` changes from the source's `config.yaml`
    (with `overrides`, `--set key=value`s, applied to it)."""
    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.sweep import config_diff

    old = load_config(source / "config.yaml", list(overrides)).model_dump(mode="json")
    new = config.model_dump(mode="json")
    for data in (old, new):  # where the run lives is no difference in what it does
        for key in ("dir", "name", "overwrite"):
            data["run"].pop(key, None)
    return config_diff(old, new)


def _checkpoint(source: Path, step: int) -> Path:
    if not (source / "config.yaml").is_file() or not (source / CHECKPOINTS).is_dir():
        raise ForkError(
            f"--fork-from {source}: not a run folder with checkpoints (config.yaml and "
            "checkpoints/); give the folder of a run started by `agentscope-rft train`"
        )
    folder = checkpoint_dir(source, step)
    if step < 0 or not (folder / RUN_STATE_FILE).is_file():
        have = checkpoint_steps(source)
        raise ForkError(
            f"--fork-step {step}: {source} has no checkpoint of step {step} (it has "
            f"{', '.join(map(str, have)) or 'none'}); fork at one of those, or re-run the source "
            "with run.checkpoint_every / run.keep_checkpoints that keep that step"
        )
    return folder


def _clear(dest: Path, source: Path, *, overwrite: bool) -> None:
    if dest.resolve() == source.resolve():
        raise ForkError(f"the fork's run folder {dest} is its source: give the fork another name")
    resumable = (dest / STATE_FILE).is_file()
    if (dest / UNFINISHED).is_file() and not resumable:
        logger.warning("%s: a fork cut off before it was made (killed?); making it again", dest)
        shutil.rmtree(dest)
    elif dest.exists() and any(dest.iterdir()):
        if not overwrite:
            advice = (
                f"continue it with `agentscope-rft train --resume {dest}`"
                if resumable
                else "it has no checkpoint to resume from"
            )
            raise ForkError(
                f"run folder {dest} already exists: {advice}; pick another run.dir, or pass "
                "--set run.overwrite=true to replace it"
            )
        logger.warning("run.overwrite: replacing %s with a fork of %s", dest, source)
        shutil.rmtree(dest)
    elif dest.exists():
        dest.rmdir()


def _cut_metrics(source: Path, dest: Path, step: int) -> None:
    """The records a run resumed at `step` keeps, resume markers applied."""
    records = before_resume(surviving_history(read_metrics(source)), step)
    writer = MetricsWriter(dest, resume=False)
    try:
        for record in records:
            writer.write(record.step, record.time or 0.0, record.phase, record.metrics)
    finally:
        writer.close()


def _cut_lines(source: Path, dest: Path, step: int) -> None:
    """A JSON-lines log cut like the metrics (lines without a step or phase are dropped)."""
    with dest.open("w", encoding="utf-8") as out:
        for line, data in _json_lines(source):
            at, phase = data.get("step"), data.get("phase")
            if isinstance(at, int) and isinstance(phase, str) and kept_at_resume(at, phase, step):
                out.write(line if line.endswith("\n") else line + "\n")


def rewind_step_logs(run_dir: Path, step: int) -> None:
    """Cut a run's step logs (`STEP_LOGS`) in place to what a resume after `step` steps keeps.

    A run killed after exploring step `step` (or later) wrote that step's rollouts, samples and
    diagnoses but never trained on them; the resumed run explores the step again, and the file
    would hold both. Each file is rewritten next to itself and swapped in, so a kill during the
    cut leaves the old file or the new one.

    Example:
        >>> rewind_step_logs(Path("runs/quickstart"), 5)  # doctest: +SKIP
    """
    for name in STEP_LOGS:
        path = run_dir / name
        if not path.is_file():
            continue
        partial = path.with_name(f"{name}.rewind")
        try:
            _cut_lines(path, partial, step)
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)  # (a full disk: a half copy would hold the space)
            raise


def _json_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                data = json.loads(line)
            except json.JSONDecodeError:  # a torn last line of a killed run
                continue
            if isinstance(data, dict):
                yield line, data


def _copy_sqlite(source: Path, dest: Path) -> None:
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    out = sqlite3.connect(dest)
    try:
        src.backup(out)
    finally:
        out.close()
        src.close()


def _rewind_best(source: Path, dest: Path, step: int, config: RunConfig) -> dict[str, Any] | None:
    """The best validation among steps <= `step`, with its model when its checkpoint is kept."""
    metric = config.run.best_metric
    names = [m.removeprefix("val/") for m in metric_names(metric)]
    if not (dest / METRICS_FILE).is_file():
        return None
    curve = [
        (logged.step, criterion_value(logged.metrics, names))
        for logged in read_metrics(dest / METRICS_FILE)
        if logged.phase == "val"
    ]
    best = best_point([(s, v) for s, v in curve if v is not None], config.run.best_mode)
    if best is None:
        return None
    at, value = best
    model = _best_model(source, at)
    if model is None:
        logger.warning(
            "fork: the best validation up to step %d was at step %d, whose checkpoint %s no "
            "longer has; the fork starts without a best checkpoint",
            step, at, source,
        )  # fmt: skip
        return None
    record = {
        "step": at,
        "metric": metric_label(metric),
        "value": value,
        "mode": config.run.best_mode,
    }
    folder = dest / CHECKPOINTS / BEST_DIR
    shutil.copytree(model, folder / "model")
    (folder / BEST_FILE).write_text(json.dumps(record))
    write_json(dest / BEST_FILE, record)
    return record


def _best_model(source: Path, step: int) -> Path | None:
    """An HF model folder of `source`'s policy after `step`: its best or a step checkpoint."""
    try:
        recorded = json.loads((source / BEST_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        recorded = None
    best_model = source / CHECKPOINTS / BEST_DIR / "model"
    if isinstance(recorded, dict) and recorded.get("step") == step and best_model.is_dir():
        return best_model
    model = checkpoint_dir(source, step) / "model"
    return model if model.is_dir() else None
