"""`status.json`: whether a run is still going, written by its `Monitor` at start and end.

`{"state": "running" | "ended", "pid", "host", "started", "ended", "error", "steps"}`: `error`
is the exception that ended the run (`null` when it ended cleanly: finished, or stopped early
on request), `steps` the configured `run.steps`. A run killed outright leaves `running` behind
with a process that no longer exists; readers (the dashboard) check the pid on the same host.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from agentscope_rft.files import replace_text

STATUS_FILE = "status.json"


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    """Replace `status.json` atomically (a reader never sees half a file)."""
    replace_text(run_dir / STATUS_FILE, json.dumps(status, indent=1))


def run_started(run_dir: Path, steps: int | None) -> dict[str, Any]:
    """Mark the run as running; returns the record `run_ended` completes."""
    status = {
        "state": "running",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": round(time.time(), 3),
        "ended": None,
        "error": None,
        "steps": steps,
    }
    write_status(run_dir, status)
    return status


def run_ended(run_dir: Path, status: dict[str, Any], error: str | None) -> None:
    """Mark the run as ended, cleanly (`error` None) or by an exception."""
    write_status(
        run_dir, {**status, "state": "ended", "ended": round(time.time(), 3), "error": error}
    )
