"""Reading `samples.jsonl`, the run's token-level sample log (written by
`agentscope_rft.runtime.sample_log`): plain JSON, no torch, so the dashboard starts fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SAMPLES_FILE = "samples.jsonl"


def read_sample_lines(path: Path, rollout_id: str | None = None) -> list[dict[str, Any]]:
    """The records of a `samples.jsonl` (those of one rollout when given), the last of each
    sample id; a torn last line (the run is writing it) and lines that are not JSON objects (or
    not UTF-8) are skipped."""
    if not path.is_file():
        return []
    needle = json.dumps(rollout_id) if rollout_id is not None else None
    out: list[dict[str, Any]] = []
    # errors="replace": a stray non-UTF-8 byte spoils only its line (skipped below as not JSON).
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if needle is not None and needle not in line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and (
                rollout_id is None or record.get("rollout_id") == rollout_id
            ):
                out.append(record)
    return latest_per_key(out, "sample_id")


def latest_per_key(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """One record per `key` value, the last written (a resumed run re-explores the steps it lost
    under the same ids and appends them again), in the order of their first appearance."""
    latest: dict[Any, dict[str, Any]] = {}
    for record in records:
        value = record.get(key)
        # A record without the key, or with one that is not an id (a hand edit), stands alone.
        latest[value if isinstance(value, str | int) else id(record)] = record
    return list(latest.values())
