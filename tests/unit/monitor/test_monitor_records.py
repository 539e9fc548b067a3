"""metrics.jsonl: what a line holds, resume, and reading it back with clear errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from agentscope_rft.monitor.records import (
    RESUME_PHASE,
    MetricRecord,
    MetricsFileError,
    MetricsWriter,
    normalize_metrics,
    per_step,
    read_metrics,
    surviving_history,
)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_writer_writes_one_flushed_line_per_record(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, resume=False)
    writer.write(1, 1700000000.12345, "train", {"reward/mean": 0.5, "policy_version": 1})
    # Flushed per line: readable before close.
    assert _lines(path) == [
        {
            "step": 1,
            "time": 1700000000.123,
            "phase": "train",
            "reward/mean": 0.5,
            "policy_version": 1,
        }
    ]
    writer.write(2, 1700000001.0, "eval", {"kl/mean": math.nan, "grad_norm": math.inf})
    writer.close()
    last = _lines(path)[-1]
    assert last == {
        "step": 2,
        "time": 1700000001.0,
        "phase": "eval",
        "kl/mean": None,
        "grad_norm": None,
    }
    assert list(last)[:3] == ["step", "time", "phase"]


def test_normalize_metrics_accepts_numpy_and_torch_scalars() -> None:
    values = normalize_metrics(
        {"a": np.float32(0.25), "b": torch.tensor(2.5), "c": np.int64(3), "d": True}
    )
    assert values == {"a": 0.25, "b": 2.5, "c": 3, "d": 1}
    assert isinstance(values["a"], float) and isinstance(values["c"], int)


@pytest.mark.parametrize("name", ["step", "time", "phase", ""])
def test_normalize_metrics_rejects_reserved_names(name: str) -> None:
    with pytest.raises(ValueError, match="reserved"):
        normalize_metrics({name: 1.0})


def test_normalize_metrics_rejects_non_numbers() -> None:
    with pytest.raises(TypeError, match="'reward/mean' is not a number"):
        normalize_metrics({"reward/mean": "0.5"})


def test_new_run_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 9, "phase": "train"}\n')
    MetricsWriter(path, resume=False).close()
    assert path.read_text() == ""


def test_resume_keeps_lines_and_drops_a_partial_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "phase": "train", "x": 1}\n{"step": 2, "phase": "tr')
    writer = MetricsWriter(path, resume=True)
    writer.write(2, 5.0, "train", {"x": 2})
    writer.close()
    assert [line["step"] for line in _lines(path)] == [1, 2]
    assert _lines(path)[1]["x"] == 2


def test_read_metrics_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, resume=False)
    writer.write(1, 10.0, "train", {"reward/mean": 0.5, "kl/mean": math.nan})
    writer.close()
    (record,) = read_metrics(path)
    assert (record.step, record.phase, record.time) == (1, "train", 10.0)
    assert record.metrics["reward/mean"] == 0.5 and math.isnan(record.metrics["kl/mean"])


def test_read_metrics_missing_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with pytest.raises(MetricsFileError, match=re.escape(f"no metrics file {path}")):
        read_metrics(path)


def test_read_metrics_empty_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n")
    with pytest.raises(MetricsFileError, match=re.escape(f"{path} is empty")):
        read_metrics(path)


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"phase": "train"}', "'step' must be an integer"),
        ('{"step": 2, "reward/mean": "high"}', "metric 'reward/mean' must be a number"),
    ],
)
def test_read_metrics_broken_line_names_file_and_line(
    tmp_path: Path, bad_line: str, problem: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(f'{{"step": 1, "reward/mean": 0.1}}\n{bad_line}\n{{"step": 3}}\n')
    with pytest.raises(MetricsFileError, match=re.escape(f"{path} line 2: {problem}")):
        read_metrics(path)


def test_read_metrics_skips_an_unterminated_broken_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 2, "rew')
    assert [record.step for record in read_metrics(path)] == [1]


def _record(step: int, phase: str = "train", **metrics: float) -> MetricRecord:
    return MetricRecord(step=step, phase=phase, time=float(step), metrics=dict(metrics))


def test_surviving_history_drops_what_a_resume_superseded() -> None:
    records = [
        _record(1, r=1.0),
        _record(2, r=2.0),
        _record(2, "eval", r=20.0),
        _record(3, r=3.0),
        _record(4, r=4.0),
        _record(4, "eval", r=40.0),
        # resumed from the checkpoint of step 2: what the crashed attempt logged from 3 on is stale
        _record(3, RESUME_PHASE),
        _record(3, r=30.0),
        # steps may go backwards within a run (an explorer ahead of the trainer): kept
        _record(2, "explore", r=7.0),
    ]
    kept = surviving_history(records)
    assert [(r.step, r.phase, r.metrics["r"]) for r in kept] == [
        (1, "train", 1.0),
        (2, "train", 2.0),
        (2, "eval", 20.0),
        (3, "train", 30.0),
        (2, "explore", 7.0),
    ]


def test_resume_marker_round_trips_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, resume=False)
    for step in (1, 2, 3):
        writer.write(step, float(step), "train", {"r": float(step)})
    writer.close()
    writer = MetricsWriter(path, resume=True)
    writer.mark_resume(2, 10.0)
    writer.write(2, 10.0, "train", {"r": 20.0})
    writer.close()
    assert _lines(path)[3] == {"step": 2, "time": 10.0, "phase": "resume"}
    kept = per_step(surviving_history(read_metrics(path)), "train")
    assert [(r.step, r.metrics["r"]) for r in kept] == [(1, 1.0), (2, 20.0)]


def test_per_step_keeps_the_last_value_and_merges_calls() -> None:
    records = [
        _record(1, explore=1.0),
        _record(1, train=2.0),
        _record(2, r=5.0),
        _record(2, r=6.0),
        _record(2, "eval", r=9.0),
    ]
    merged = per_step(records, "train")
    assert [(r.step, r.metrics) for r in merged] == [
        (1, {"explore": 1.0, "train": 2.0}),
        (2, {"r": 6.0}),
    ]
    assert [r.step for r in per_step(records, "eval")] == [2]
