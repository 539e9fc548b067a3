"""Finding the runs under a runs folder and summarizing each: status, progress, best metric.

Every read here tolerates a run that is being written (a torn last line, a missing file) and a
malformed one (its summary carries the error instead of failing the whole list).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from agentscope_rft.monitor.records import (
    METRICS_FILE,
    MetricRecord,
    MetricsFileError,
    read_metrics,
    surviving_history,
)
from agentscope_rft.monitor.status import STATUS_FILE

RUN_MARKERS = ("config.yaml", METRICS_FILE, STATUS_FILE, "rollouts.jsonl")
"""A folder holding any of these is a run folder."""
VALIDATION_PHASES = ("val", "eval")
"""Phases whose `reward/mean` is the run's validation metric, preferred first."""
STALE_AFTER_S = 600.0
"""A run without a status file counts as running while its metrics changed this recently."""


class RunNotFound(LookupError):
    """A run id that names no run folder under the dashboard's runs folder."""


@dataclass(frozen=True)
class RunRef:
    """A run folder found under the runs folder."""

    id: str
    """Its path relative to the runs folder (`quickstart`, `sweep/seed-1`)."""
    path: Path
    group: str | None = None
    """The seed sweep it belongs to (the sweep folder's name)."""
    seed: int | None = None


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in RUN_MARKERS)


def discover_runs(root: Path) -> list[RunRef]:
    """The run folders directly under `root`, and those one level inside a seed-sweep folder
    (one with `sweep.json`, or any folder of run folders). `root` may itself be a run folder.

    Example:
        >>> [r.id for r in discover_runs(Path("runs"))]  # doctest: +SKIP
        ['quickstart', 'sweep/seed-0', 'sweep/seed-1']
    """
    root = root.resolve()
    if is_run_folder(root) and not (root / "sweep.json").is_file():
        return [RunRef(root.name, root)]
    if not root.is_dir():
        return []
    found: list[RunRef] = []
    for child in sorted(root.iterdir()):
        if not _inside(child, root) or not child.is_dir():
            continue
        if is_run_folder(child) and not (child / "sweep.json").is_file():
            found.append(RunRef(child.name, child))
            continue
        seeds = _sweep_seeds(child)
        for grand in sorted(child.iterdir()):
            if _inside(grand, root) and is_run_folder(grand):
                found.append(
                    RunRef(f"{child.name}/{grand.name}", grand, child.name, seeds.get(grand.name))
                )
    return found


def _inside(path: Path, root: Path) -> bool:
    """Whether `path` (links followed) stays inside `root`: a link out of it is not served."""
    try:
        path.resolve().relative_to(root)
    except (OSError, ValueError):
        return False
    return True


def _sweep_seeds(folder: Path) -> dict[str, int]:
    """Seed by run folder name, from the sweep's `sweep.json` (`{"runs": {"0": "seed-0"}}`)."""
    data = read_json(folder / "sweep.json")
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict):
        return {}
    out: dict[str, int] = {}
    for seed, name in runs.items():
        try:
            out[str(name)] = int(seed)
        except ValueError:
            continue
    return out


def find_run(root: Path, run_id: str) -> RunRef:
    """The run named `run_id`; ids that would leave the runs folder are refused.

    Raises:
        PermissionError: an absolute path or `..` in the id.
        RunNotFound: no run folder with that id under `root`.
    """
    parts = PurePosixPath(run_id).parts
    if not parts or run_id.startswith("/") or "\\" in run_id or ".." in parts:
        raise PermissionError(f"run id {run_id!r} points outside the runs folder: refused")
    for ref in discover_runs(root):
        if ref.id == run_id:
            return ref
    raise RunNotFound(f"no run {run_id!r} under {root}: the runs list shows the ones there are")


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it is missing, being written, or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; a torn last line and non-object lines are skipped."""
    return list(iter_jsonl(path))


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """`read_jsonl` a line at a time (a long file is not held in memory)."""
    if not path.is_file():
        return
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def metric_history(path: Path) -> list[MetricRecord]:
    """The surviving metrics records of a run (resume markers applied); none yet when the run
    has not finished writing its first line (the file is created when the run starts).

    Raises:
        MetricsFileError: a missing or malformed `metrics.jsonl` (a half-written last line is
            skipped, not an error).
    """
    file = path / METRICS_FILE
    try:
        return surviving_history(read_metrics(file))
    except MetricsFileError:
        if file.is_file() and not _has_a_whole_line(file):
            return []
        raise


def _has_a_whole_line(file: Path) -> bool:
    try:
        data = file.read_bytes()
    except OSError:
        return False
    return bool(data[: data.rfind(b"\n") + 1].strip())


def flat_config(path: Path) -> dict[str, Any]:
    """The run's resolved `config.yaml` as `{"trainer.lr": 2e-5, ...}` (empty if unreadable)."""
    return read_config(path)[0]


def read_config(path: Path) -> tuple[dict[str, Any], str | None]:
    """The run's flat `config.yaml` (see `flat_config`) and, when the file is there but is not
    a YAML mapping, what is wrong with it."""
    file = path / "config.yaml"
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = (
            f"line {mark.line + 1}: {getattr(exc, 'problem', None) or 'not YAML'}"
            if mark is not None
            else str(exc) or type(exc).__name__
        )
        return {}, f"{file} is unreadable ({reason}): its settings and model are not shown"
    if not isinstance(data, dict):
        return {}, (
            f"{file} is not a YAML mapping (got {type(data).__name__}): its settings and model "
            "are not shown"
        )
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, child in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), child)
        else:
            flat[prefix] = value

    walk("", data)
    return flat, None


def summarize(ref: RunRef) -> dict[str, Any]:
    """What the runs list shows for one run."""
    config, config_problem = read_config(ref.path)
    status = read_json(ref.path / STATUS_FILE)
    status = status if isinstance(status, dict) else {}
    # status.json records run.steps too: the runs list still knows it when config.yaml is broken.
    total = config.get("run.steps", status.get("steps"))
    summary: dict[str, Any] = {
        "id": ref.id,
        "name": config.get("run.name") or ref.path.name,
        "group": ref.group,
        "seed": ref.seed if ref.seed is not None else config.get("run.seed"),
        "total_steps": total,
        "config": config,
        "error": config_problem,
    }
    records: list[MetricRecord] = []
    try:
        records = metric_history(ref.path)
    except MetricsFileError as exc:
        if (ref.path / METRICS_FILE).is_file():
            summary["error"] = "; ".join(filter(None, (config_problem, str(exc))))
    train_steps = [r.step for r in records if r.phase == "train"]
    summary["steps_done"] = max(train_steps) + 1 if train_steps else 0
    times = [r.time for r in records if r.time is not None]
    summary["started"] = status.get("started") or (min(times) if times else None)
    summary["updated"] = max(times) if times else None
    summary["status"], summary["status_detail"] = run_status(ref.path, status, summary)
    summary["last_validation"] = last_validation(records)
    summary["best"] = best_metric(ref.path, records)
    summary["health_events"] = len(read_jsonl(ref.path / "health.jsonl"))
    return summary


def run_status(path: Path, status: dict[str, Any], summary: dict[str, Any]) -> tuple[str, str]:
    """(`running` | `finished` | `failed` | `stopped` | `recording` | `recorded`, a short reason).

    `recording` / `recorded`: a folder of live traffic written by `serve --record` (no training
    run: its state is whether episodes were written to it recently).
    """
    total, done = summary.get("total_steps"), summary["steps_done"]
    if summary.get("config", {}).get("recorded_by") and not status:
        episodes = path / "rollouts.jsonl"
        age = time.time() - episodes.stat().st_mtime if episodes.is_file() else None
        if age is not None and age < STALE_AFTER_S:
            return "recording", f"live traffic from `serve --record`: an episode {age:.0f} s ago"
        return "recorded", (
            "live traffic recorded by `serve --record`: rate its episodes, then train on them "
            "with offline.format: review"
        )
    if status.get("state") == "running":
        alive = _process_alive(status.get("pid"), status.get("host"))
        if alive is False:
            return "failed", "the run's process is gone (killed?) and it did not record an end"
        return "running", f"pid {status.get('pid')} on {status.get('host')}"
    if status.get("state") == "ended":
        if status.get("error"):
            return "failed", str(status["error"])
        if isinstance(total, int) and done >= total:
            return "finished", f"{done} of {total} steps"
        of = f" of {total}" if isinstance(total, int) else ""
        return "stopped", f"stopped after {done}{of} steps: resume with --resume"
    # An older run without a status file: judge by its checkpoint and how fresh its files are.
    state = read_json(path / "state.json")
    if isinstance(total, int) and isinstance(state, dict) and state.get("step", 0) >= total:
        return "finished", "checkpoint of the last step saved"
    updated = summary.get("updated")
    if updated is not None and time.time() - updated < STALE_AFTER_S:
        return "running", "metrics written recently (no status file)"
    return "stopped", "no status file; not written to recently"


def _process_alive(pid: Any, host: Any) -> bool | None:
    """Whether the run's process still exists (None: cannot tell from this machine)."""
    if not isinstance(pid, int) or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def last_validation(records: list[MetricRecord]) -> dict[str, Any] | None:
    """The latest validation `reward/mean` (phase `val`, else `eval`)."""
    for phase in VALIDATION_PHASES:
        rows = [r for r in records if r.phase == phase and _finite(r.metrics.get("reward/mean"))]
        if rows:
            last = max(rows, key=lambda r: r.step)
            return {"phase": phase, "step": last.step, "value": last.metrics["reward/mean"]}
    return None


def best_metric(path: Path, records: list[MetricRecord]) -> dict[str, Any] | None:
    """The best validation metric: `best.json` when the run keeps a best checkpoint, else the
    highest validation `reward/mean` in its metrics."""
    best = read_json(path / "best.json")
    if isinstance(best, dict) and _finite(best.get("value")):
        return {
            "step": best.get("step"),
            "metric": best.get("metric"),
            "value": best["value"],
            "mode": best.get("mode", "max"),
            "source": "best.json",
        }
    for phase in VALIDATION_PHASES:
        rows = [r for r in records if r.phase == phase and _finite(r.metrics.get("reward/mean"))]
        if rows:
            top = max(rows, key=lambda r: r.metrics["reward/mean"])
            return {
                "step": top.step,
                "metric": f"{phase}/reward/mean",
                "value": top.metrics["reward/mean"],
                "mode": "max",
                "source": "metrics",
            }
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


RECORDING_NOTE = (
    "live traffic recorded by `serve --record` has no curves: rate its episodes (Episodes tab), "
    "then train with offline.format: review"
)


def metrics_payload(ref: RunRef) -> dict[str, Any]:
    """Every metrics record and health event of a run, for the curves (a recording of live
    traffic has none, and a `note` that says so)."""
    if not (ref.path / METRICS_FILE).exists() and flat_config(ref.path).get("recorded_by"):
        return {"id": ref.id, "records": [], "health": [], "note": RECORDING_NOTE}
    records = metric_history(ref.path)
    return {
        "id": ref.id,
        "records": [
            {
                "step": r.step,
                "time": r.time,
                "phase": r.phase,
                "metrics": {k: (v if math.isfinite(v) else None) for k, v in r.metrics.items()},
            }
            for r in records
        ],
        "health": read_jsonl(ref.path / "health.jsonl"),
    }
